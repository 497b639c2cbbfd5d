#!/usr/bin/env bash
# Regenerates every golden fixture under tests/golden/ with the independent references (PyTorch, Jinja2).
# Needs /usr/bin/python3 with torch (scripts/install-deps.sh --reference). Not part of `make test`.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=/usr/bin/python3
$PY tests/reference/attn_reference.py
