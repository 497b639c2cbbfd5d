#!/usr/bin/env bash
# Regenerates every golden fixture under tests/golden with the independent reference scripts in
# tests/reference (needs the packages in deps/reference/: scripts/install-deps.sh --reference).
set -euo pipefail
cd "$(dirname "$0")/.."
/usr/bin/python3 tests/reference/io_tfevents.py
/usr/bin/python3 tests/reference/io_safetensors.py
