"""Writes the data-build fixtures in tests/golden/data/: the same conversations as JSONL (plain, gzip, zstd) and
as Parquet from independent writers, plus malformed inputs.

  deps/venv/bin/python tests/reference/data_fixtures.py      (pyarrow and duckdb-cli: scripts/install-deps.sh)

Writers: DuckDB (the duckdb-cli binary; zstd + snappy, a two-file split, the skips and bad-column files) and
pyarrow (Arrow C++'s Parquet writer: v2 pages, lz4, large_list/large_string types). Two more Parquet fixtures come
from JavaScript writers that earlier rounds ran through npm, which these machines no longer reach:
convs.hyparquet.v2.snappy.parquet (hyparquet-writer 0.17.0) and convs.parquetwasm.{v1.zstd,v2.snappy}.parquet
(parquet-wasm 0.8.0, the Rust parquet crate), and bad-utf8.parquet (hyparquet-writer). They are kept as committed
files (frozen; their sha256 is checked below so a change is noticed), not regenerated.
Deterministic: a rerun reproduces every file it writes byte for byte (check with `git status`).
"""
import gzip
import hashlib
import json
import os
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
OUT = os.path.join(ROOT, "tests", "golden", "data")
FROZEN = {  # written by npm-era JavaScript writers (see the docstring)
    "convs.hyparquet.v2.snappy.parquet": "hyparquet-writer 0.17.0",
    "convs.parquetwasm.v1.zstd.parquet": "parquet-wasm 0.8.0",
    "convs.parquetwasm.v2.snappy.parquet": "parquet-wasm 0.8.0",
    "bad-utf8.parquet": "hyparquet-writer 0.17.0",
}


def duckdb_bin():
    import duckdb_cli

    return os.path.join(os.path.dirname(duckdb_cli.__file__), "duckdb")


def lcg(seed):
    s = seed & 0xFFFFFFFF

    def rnd():
        nonlocal s
        s = (s * 1664525 + 1013904223) & 0xFFFFFFFF
        return s / 4294967296

    return rnd


def conversations():
    """The same 41 conversations as the earlier JavaScript generator (same LCG, same draws)."""
    rnd = lcg(12345)
    words = ["alpha", "beta", "gamma", "delta", "épsilon", "zeta", "η", "theta", "日本", "kappa", "λ", "mu",
             "🙂", "nu"]

    def sentence(n):
        return " ".join(words[int(rnd() * len(words))] for _ in range(n))

    sources = ["src_math", "src_code", "src_chat"]
    convs = []
    for i in range(40):
        turns = 1 + int(rnd() * 3)
        messages = []
        if i % 5 == 0:
            messages.append({"role": "system", "content": "You are terse. " + sentence(2)})
        for _ in range(turns):
            messages.append({"role": "user", "content": sentence(1 + int(rnd() * (60 if i % 7 == 0 else 12)))})
            messages.append({"role": "assistant",
                             "content": sentence(1 + int(rnd() * (90 if i % 11 == 0 else 20)))})
        convs.append({"id": "c%03d" % i, "source_dataset": sources[i % 3], "messages": messages})
    convs.append({"id": "c_dup", "source_dataset": "src_chat", "messages": convs[3]["messages"]})
    return convs


def jsonl(rows):
    # JavaScript's JSON.stringify: no spaces, non-ASCII kept as UTF-8.
    return "".join(json.dumps(r, ensure_ascii=False, separators=(",", ":")) + "\n" for r in rows)


def duck(sql):
    subprocess.run([duckdb_bin(), "-no-init", "-batch", "-bail", "-c", sql, ":memory:"], check=True,
                   stdin=subprocess.DEVNULL)


def write_duckdb(out):
    src = os.path.join(out, "convs.jsonl").replace("'", "''")
    o = out.replace("'", "''")
    msg = "STRUCT(role VARCHAR, content VARCHAR)[]"
    duck(f"""
CREATE TABLE t AS SELECT id, source_dataset, messages FROM read_json('{src}', format='newline_delimited',
  columns={{id:'VARCHAR', source_dataset:'VARCHAR', messages:'{msg}'}});
COPY t TO '{o}/convs.duckdb.zstd.parquet' (FORMAT parquet, COMPRESSION zstd);
COPY (SELECT * FROM t WHERE id < 'c020') TO '{o}/split-0.duckdb.snappy.parquet' (FORMAT parquet, COMPRESSION snappy);
COPY (SELECT * FROM t WHERE id >= 'c020') TO '{o}/split-1.duckdb.snappy.parquet' (FORMAT parquet, COMPRESSION snappy);
COPY (SELECT id, source_dataset, messages AS msgs FROM t LIMIT 3) TO '{o}/bad-no-messages.parquet' (FORMAT parquet);
COPY (SELECT id, CAST(to_json(messages) AS VARCHAR) AS messages FROM t LIMIT 3)
  TO '{o}/bad-messages-string.parquet' (FORMAT parquet);
COPY (SELECT * FROM (VALUES
    ('e1', 'src_bad', []::{msg}),
    ('e2', 'src_bad', NULL::{msg}),
    ('e3', 'src_bad', [{{'role': 'user', 'content': 'hello'}}]),
    ('e4', 'src_bad', [{{'role': NULL, 'content': 'x'}}, {{'role': 'assistant', 'content': 'y'}}]),
    ('e5', 'src_bad', [{{'role': 'user', 'content': 'hi'}}, {{'role': 'assistant', 'content': 'fine'}}])
  ) v(id, source_dataset, messages)) TO '{o}/skips.duckdb.parquet' (FORMAT parquet);
""")


def write_pyarrow(out, convs):
    # large_string / large_list and a non-default element name: types DuckDB's writer never emits.
    role = pa.field("role", pa.large_string())
    content = pa.field("content", pa.large_string())
    msgs = pa.large_list(pa.field("item", pa.struct([role, content])))
    table = pa.table({
        "id": pa.array([c["id"] for c in convs], pa.large_string()),
        "source_dataset": pa.array([c["source_dataset"] for c in convs], pa.large_string()),
        "messages": pa.array([c["messages"] for c in convs], msgs),
    })
    pq.write_table(table, os.path.join(out, "convs.pyarrow.v2.lz4.parquet"), compression="lz4",
                   data_page_version="2.0", row_group_size=9, store_schema=True)


def main():
    os.makedirs(OUT, exist_ok=True)
    convs = conversations()
    with open(os.path.join(OUT, "convs.jsonl"), "w", encoding="utf-8") as f:
        f.write(jsonl(convs))
    data = jsonl(convs).encode()
    with open(os.path.join(OUT, "convs.jsonl.gz"), "wb") as f:
        f.write(gzip.compress(data, mtime=0))
    subprocess.run(["zstd", "-q", "-f", "-19", os.path.join(OUT, "convs.jsonl"), "-o",
                    os.path.join(OUT, "convs.jsonl.zst")], check=True)
    write_duckdb(OUT)
    write_pyarrow(OUT, convs)
    with open(os.path.join(OUT, "convs.duckdb.zstd.parquet"), "rb") as f:
        full = f.read()
    with open(os.path.join(OUT, "bad-truncated.parquet"), "wb") as f:
        f.write(full[: int(len(full) * 0.6)])
    good = jsonl(convs[:1]).encode()
    bad = (b'{"id":"u1","source_dataset":"x","messages":[{"role":"user","content":"bad ' + bytes([0xC3, 0x28, 0xFF]) +
           b'"},{"role":"assistant","content":"ok"}]}\n')
    with open(os.path.join(OUT, "bad-utf8.jsonl"), "wb") as f:
        f.write(good + bad)
    with open(os.path.join(OUT, "bad-types.jsonl"), "w") as f:
        f.write(jsonl([{"id": "t1", "messages": "not a list"}, {"id": "t2", "messages": 42}]))
    with open(os.path.join(OUT, "FROZEN.sha256")) as f:
        want = dict(line.split()[::-1] for line in f if line.strip())
    for name, writer in FROZEN.items():
        with open(os.path.join(OUT, name), "rb") as f:
            got = hashlib.sha256(f.read()).hexdigest()
        if want.get(name) != got:
            sys.exit(f"{name} (frozen, from {writer}) changed: sha256 {got}, expected {want.get(name)}")
    print("wrote fixtures to", OUT)


if __name__ == "__main__":
    main()
