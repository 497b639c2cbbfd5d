#!/usr/bin/env bash
# Regenerates every golden fixture with its independent reference (not part of make test).
set -euo pipefail
cd "$(dirname "$0")/.."
# data: the same conversations as JSONL and as Parquet from DuckDB, hyparquet-writer and parquet-wasm (+ malformed)
node tests/reference/data_fixtures.mjs
