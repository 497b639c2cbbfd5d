#!/usr/bin/env bash
# Regenerate every golden fixture under tests/golden/ from the independent references in tests/reference/
# (Debian's python3-torch / numpy, installed by `scripts/install-deps.sh --reference`; the pinned PyPI oracles of
# deps/venv-reference for the tokenizer; the build venv deps/venv for the data fixtures). The generators are seeded, so a rerun reproduces the committed files byte for byte
# (check with `git status` afterwards). `make test` never runs this.
# Usage: scripts/make-fixtures.sh [--check]   (--check also runs each reference's slow self-checks)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=/usr/bin/python3  # Debian's interpreter (has torch/numpy/jinja2); a pyenv python3 on PATH does not
check=0
[[ "${1:-}" == "--check" ]] && check=1
scripts/install-deps.sh >/dev/null  # deps/dolma2/allenai_dolma2.json (the tok generators read it)

# --- kernels: linear/RMSNorm/SwiGLU, RoPE+YaRN, softmax CE + z-loss, clip + AdamW
(cd tests/reference && for s in kernels_dense.py kernels_rope.py kernels_xent.py kernels_adamw.py; do "$PY" "$s"; done)

# --- attention: explicit-mask torch attention with autograd
"$PY" tests/reference/attn_reference.py

# --- kda: conv, l2norm, gate, recurrence, output norm (float64 autograd)
"$PY" tests/reference/kda_reference.py

# --- io: TensorBoard records through the protobuf runtime
"$PY" tests/reference/io_tfevents.py
"$PY" tests/reference/io_safetensors.py

# --- tok: tokenizer corpus, chat templates, label masks: the pinned upstream oracles of deps/venv-reference
# (HF tokenizers 0.23.3 on deps/dolma2/allenai_dolma2.json, jinja2 3.1.6)
REF_PY=deps/venv-reference/bin/python
if [[ ! -x "$REF_PY" ]]; then
  echo "make-fixtures: $REF_PY not found (scripts/install-deps.sh --reference)" >&2
  exit 1
fi
"$REF_PY" tests/reference/tok_corpus.py
"$REF_PY" tests/reference/tok_templates.py
"$REF_PY" tests/reference/tok_labels.py

# --- data: JSONL and Parquet (DuckDB CLI, pyarrow) fixtures of the same conversations (build venv)
deps/venv/bin/python tests/reference/data_fixtures.py

# --- model (tests/golden/model/): Olmo 3 dense and Olmo 3.5 hybrid references
"$PY" tests/reference/model_olmo3.py
"$PY" tests/reference/model_olmo3moe.py
"$PY" tests/reference/model_forward_inputs.py  # e2e inputs for `olmosft forward`, from olmo3_tiny
if ((check)); then
  "$PY" tests/reference/model_safetensors.py --check
  "$PY" tests/reference/model_olmo3.py --check
  "$PY" tests/reference/model_olmo3moe.py --check
fi
