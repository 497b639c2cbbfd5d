#!/usr/bin/env bash
# Regenerates every golden fixture with the independent references (PyTorch, Jinja2). Not part of make test.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=/usr/bin/python3
$PY tests/reference/kda_reference.py
