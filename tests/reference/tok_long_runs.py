"""Golden ids for long single-word runs (base64 blobs, digit strings, one repeated character, ASCII art),
encoded by Hugging Face `tokenizers` (pinned in deps/pypi/reference.txt) on the real dolma2 tokenizer.json.
Such a run is one pre-tokenizer piece, so it exercises the BPE merge loop at length: olmosft's merge was
quadratic in the piece's length (issue: a 256 KiB run of 'a' took minutes).

Each case is `unit` repeated `reps` times (C++ rebuilds the text the same way); the golden keeps the token
count and the sha256 of the ids as little-endian int32, plus the first 16 ids for a readable diff.
Output: tests/golden/tok/long_runs.json.
Usage: deps/venv-reference/bin/python tests/reference/tok_long_runs.py   (scripts/make-fixtures.sh runs it)
"""
import hashlib
import json
import os
import struct

import tokenizers
from tokenizers import Tokenizer

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
TOKENIZER = os.path.join(ROOT, "deps/dolma2/allenai_dolma2.json")
DOLMA2_SHA256 = "3ca996cca8afea58b34e95c353e859333592642a5e51d695d7a6dbbaf692dfe9"
OUT = os.path.join(ROOT, "tests/golden/tok/long_runs.json")

CASES = [
    ("a", 262144),                 # one character, 256 KiB: the worst case of the old merge loop
    ("ab", 65536),                 # two alternating characters
    ("QUJDREVGR0g+/=", 16384),     # a base64-looking blob
    ("7", 100000),                 # digits (the pre-tokenizer cuts them into groups of three)
    ("=-", 50000),                 # ASCII-art rules
    ("é", 40000),                  # a two-byte character repeated
    ("東京", 20000),               # three-byte characters
]


def main():
    with open(TOKENIZER, "rb") as f:
        data = f.read()
    assert hashlib.sha256(data).hexdigest() == DOLMA2_SHA256, "not the pinned dolma2 tokenizer.json"
    tok = Tokenizer.from_str(data.decode("utf-8"))
    cases = []
    for unit, reps in CASES:
        ids = tok.encode(unit * reps, add_special_tokens=False).ids
        blob = struct.pack("<%di" % len(ids), *ids)
        cases.append({"unit": unit, "reps": reps, "count": len(ids), "sha256": hashlib.sha256(blob).hexdigest(),
                      "head": ids[:16]})
    meta = {"generator": "tests/reference/tok_long_runs.py", "tokenizers": tokenizers.__version__,
            "sha256": DOLMA2_SHA256}
    with open(OUT, "w", encoding="utf-8") as f:
        f.write('{"meta": %s,\n "cases": [\n  ' % json.dumps(meta))
        f.write(",\n  ".join(json.dumps(c, ensure_ascii=False) for c in cases))
        f.write("\n ]}\n")
    print("wrote", OUT, len(cases), "cases")


if __name__ == "__main__":
    main()
