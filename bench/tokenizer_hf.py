"""Peer of bench_tokenizer: Hugging Face `tokenizers` (Rust) on the same dolma2 tokenizer.json and documents.
Usage: python bench/tokenizer_hf.py TOKENIZER_JSON DOCS_JSON THREADS
Encodes the documents with encode_batch (specials as text, no added special tokens: what olmosft's
encode(text, allow_special=false) does) on THREADS rayon threads, and prints one line:
  hf <version> threads=<n> bytes=<b> tokens=<t> seconds=<s>
"""
import json
import os
import sys
import time

path, docs_path, threads = sys.argv[1], sys.argv[2], int(sys.argv[3])
# The rayon pool reads these when it is first used: set them before importing tokenizers.
os.environ["RAYON_NUM_THREADS"] = str(threads)
os.environ["TOKENIZERS_PARALLELISM"] = "true" if threads > 1 else "false"
import tokenizers  # noqa: E402
from tokenizers import Tokenizer  # noqa: E402

tok = Tokenizer.from_file(path)
tok.encode_special_tokens = True
with open(docs_path, encoding="utf-8") as f:
    docs = json.load(f)
n_bytes = sum(len(d.encode("utf-8")) for d in docs)
tok.encode_batch(docs[:200], add_special_tokens=False)  # warm-up (thread pool, caches)
t0 = time.perf_counter()
out = tok.encode_batch(docs, add_special_tokens=False)
s = time.perf_counter() - t0
print(f"hf {tokenizers.__version__} threads={threads} bytes={n_bytes} tokens={sum(len(e.ids) for e in out)} "
      f"seconds={s:.4f}")
