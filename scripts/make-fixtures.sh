#!/usr/bin/env bash
# Regenerate every golden fixture under tests/golden/ from the reference scripts in tests/reference/.
# Needs the reference packages (scripts/install-deps.sh --reference): Debian's python3-torch / numpy.
# The generators are seeded and single-threaded, so a rerun reproduces the committed files byte for byte
# (check with `git status` afterwards).  `make test` never runs this.
# Usage: scripts/make-fixtures.sh [--check]   (--check also runs each reference's slow self-checks)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=/usr/bin/python3
check=0
[[ "${1:-}" == "--check" ]] && check=1

# --- model (tests/golden/model/): Olmo 3 dense and Olmo 3.5 hybrid references
"$PY" tests/reference/model_olmo3.py
"$PY" tests/reference/model_olmo3moe.py
if ((check)); then
  "$PY" tests/reference/model_safetensors.py --check
  "$PY" tests/reference/model_olmo3.py --check
  "$PY" tests/reference/model_olmo3moe.py --check
fi
