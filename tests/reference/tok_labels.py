"""Reference loss masks: tokenizes the Python jinja2 renders in tests/golden/tok/templates.json (full render and,
per assistant turn, the header/through prefix renders written by tests/reference/tok_templates.py) with Hugging
Face `tokenizers` (Rust, pinned in deps/pypi/reference.txt) on the real dolma2 tokenizer.json
(deps/dolma2/allenai_dolma2.json, sha256-checked), specials matched as HF's chat path does, and applies the span
rule of docs/reference/sft_pipeline.md 1.4 (the prefix-stable branch of MaxText's H045 rule, which mirrors open-instruct);
"special" is the tokenizer file's own `special` flag. Writes tests/golden/tok/labels.json. Independent of the
C++ tokenizer and template engine.
Usage: deps/venv-reference/bin/python tests/reference/tok_labels.py   (after tok_templates.py; make-fixtures.sh)
"""
import hashlib
import json
import os
import sys

import tokenizers
from tokenizers import Tokenizer

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
TOKENIZER = os.path.join(ROOT, "deps/dolma2/allenai_dolma2.json")
DOLMA2_SHA256 = "3ca996cca8afea58b34e95c353e859333592642a5e51d695d7a6dbbaf692dfe9"
TOKENIZERS_VERSION = "0.23.3"


def load_tokenizer():
    if tokenizers.__version__ != TOKENIZERS_VERSION:
        sys.exit(f"tok_labels.py: tokenizers {tokenizers.__version__}, expected {TOKENIZERS_VERSION}")
    with open(TOKENIZER, "rb") as f:
        sha = hashlib.sha256(f.read()).hexdigest()
    if sha != DOLMA2_SHA256:
        sys.exit(f"tok_labels.py: {TOKENIZER} has sha256 {sha}, expected {DOLMA2_SHA256}")
    tok = Tokenizer.from_file(TOKENIZER)
    tok.encode_special_tokens = False  # the rendered template contains <|im_start|> etc.: match them
    special = {i for i, a in tok.get_added_tokens_decoder().items() if a.special}
    return tok, special


def lcp(a, b):
    k = 0
    while k < len(a) and k < len(b) and a[k] == b[k]:
        k += 1
    return k


def h045(r, conv, full, enc, dec):
    """What MaxText's H045 "prefix" rule (token counts + content checks when not prefix-stable) gives."""
    stable = all(r["full"].startswith(t["through"]) and (t["index"] == 0 or r["full"].startswith(t["header"]))
                 for t in r["turns"])
    trained = [0] * len(full)
    for t in r["turns"]:
        h = enc(t["header"])
        start = 0
        if t["index"] > 0:
            start = lcp(h, full) if stable else len(h)
        end = min(len(enc(t["through"])), len(full))
        if not stable:
            span = dec(full[start:end]) if start < end else ""
            content = conv[t["index"]].get("content") or ""
            ok = content in span and span.lstrip().startswith(content)
            if any(later and later in span for later in t["later"]):
                ok = False
            if not ok:
                return "h045 span check fails"
        for k in range(start, end):
            trained[k] = 1
    return trained


def label_row(r, conv, enc, dec, special):
    out = {"template": r["template"], "conversation": r["conversation"]}
    if "error" in r:
        out["error"] = "template: " + r["error"]
        return out
    late = [i for i, m in enumerate(conv) if m["role"] == "system" and i != 0]
    if late:
        out["error"] = f"system message at index {late[0]}"
        return out
    if not r["turns"]:
        out["error"] = "no assistant turn"
        return out
    full = enc(r["full"])
    trained = [0] * len(full)
    for t in r["turns"]:
        start = 0 if t["index"] == 0 else lcp(enc(t["header"]), full)
        th = enc(t["through"])
        end = lcp(th, full)
        if end < len(th):
            if end + 1 == len(th) and end < len(full) and th[end] in special and full[end] in special:
                end += 1
            else:
                out["error"] = f"message {t['index']}: through render diverges"
                return out
        if end <= start:
            out["error"] = f"message {t['index']}: empty span"
            return out
        if full[end - 1] not in special:
            out["error"] = f"message {t['index']}: span does not end in a special token"
            return out
        for k in range(start, end):
            trained[k] = 1
    out["h045_agrees"] = h045(r, conv, full, enc, dec) == trained
    out["prefix_stable"] = all(r["full"].startswith(t["through"]) and
                               (t["index"] == 0 or r["full"].startswith(t["header"])) for t in r["turns"])
    out["tokens"] = full
    out["trained"] = trained
    return out


def main():
    tok, special = load_tokenizer()

    def enc(s):
        return tok.encode(s, add_special_tokens=False).ids if s else []

    def dec(ids):
        return tok.decode(ids, skip_special_tokens=False)

    with open(os.path.join(ROOT, "tests/golden/tok/templates.json"), encoding="utf-8") as f:
        g = json.load(f)
    rows = [label_row(r, g["conversations"][r["conversation"]], enc, dec, special) for r in g["labels"]]
    path = os.path.join(ROOT, "tests/golden/tok/labels.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump({"generator": f"tests/reference/tok_labels.py (HF tokenizers {tokenizers.__version__}, "
                                "deps/dolma2/allenai_dolma2.json)", "rows": rows}, f, separators=(",", ":"))
        f.write("\n")
    trainable = [r for r in rows if "tokens" in r]
    print(f"H045 rule agrees on {sum(r['h045_agrees'] for r in trainable)} of {len(trainable)} trainable rows")
    print(f"wrote {len(rows)} label rows ({sum('error' in r for r in rows)} errors) to {os.path.relpath(path, ROOT)}")


if __name__ == "__main__":
    main()
