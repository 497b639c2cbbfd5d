#!/usr/bin/env bash
# Regenerates the golden fixtures under tests/golden/ with the independent Python references
# (Debian's python3-torch etc., installed by `scripts/install-deps.sh --reference`). Not part of make test.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=/usr/bin/python3  # Debian's interpreter (has torch/numpy); a pyenv python3 on PATH does not

# kernels: linear/RMSNorm/SwiGLU, RoPE+YaRN, softmax CE + z-loss, clip + AdamW
(cd tests/reference && for s in kernels_dense.py kernels_rope.py kernels_xent.py kernels_adamw.py; do "$PY" "$s"; done)
