#!/usr/bin/env bash
# Regenerate every golden fixture under tests/golden/ from the independent references in tests/reference/
# (Debian's python3-torch / numpy, installed by `scripts/install-deps.sh --reference`; the upstream oracles
# pinned in deps/pypi/reference.txt -- transformers, PyPI torch, HF tokenizers, jinja2, tensorboard -- from the
# reference venv deps/venv-reference, made by the same command; the build venv deps/venv for the data fixtures).
# The TensorBoard fixture's event file is written by our own writer, so that step needs a build (BUILD=build by
# default: cmake --build build --target io_tb_upstream_test). The generators are seeded, so a rerun reproduces
# the committed files byte for byte (check with `git status` afterwards). `make test` never runs this.
# Usage: scripts/make-fixtures.sh [--check]   (--check also runs each reference's slow self-checks)
#   OLMOSFT=path/to/olmosft (default build/olmosft, built first by `make build`): the transformers
#   cross-check of our HF export (tests/reference/hf_olmo3.py) runs `olmosft export hf` and `olmosft forward`.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=/usr/bin/python3  # Debian's interpreter (has torch/numpy/jinja2); a pyenv python3 on PATH does not
REFPY=deps/venv-reference/bin/python  # pinned upstream oracles: transformers 5.23.0, torch 2.15.0, tensorboard 2.21.0
OLMOSFT=${OLMOSFT:-build/olmosft}
BUILD="${BUILD:-build}"
[[ -x "$REFPY" ]] || { echo "make-fixtures: $REFPY missing: run scripts/install-deps.sh --reference" >&2; exit 1; }
[[ -x "$OLMOSFT" ]] || { echo "make-fixtures: $OLMOSFT missing: run make build (or set OLMOSFT)" >&2; exit 1; }
[[ -x "$BUILD/io_tb_upstream_test" ]] || {
  echo "make-fixtures: $BUILD/io_tb_upstream_test missing (cmake --build $BUILD --target io_tb_upstream_test)" >&2
  exit 1
}
check=0
[[ "${1:-}" == "--check" ]] && check=1
scripts/install-deps.sh >/dev/null  # deps/dolma2/allenai_dolma2.json (the tok generators read it)

# --- kernels: linear/RMSNorm/SwiGLU, RoPE+YaRN, softmax CE + z-loss, clip + AdamW
(cd tests/reference && for s in kernels_dense.py kernels_rope.py kernels_xent.py kernels_adamw.py; do "$PY" "$s"; done)

# --- attention: explicit-mask torch attention with autograd
"$PY" tests/reference/attn_reference.py

# --- kda: conv, l2norm, gate, recurrence, output norm (float64 autograd)
"$PY" tests/reference/kda_reference.py

# --- kda vs upstream: transformers' Kimi Linear chunk/recurrent_kimi_delta_attention, one document per call
"$REFPY" tests/reference/kda_upstream.py

# --- io: TensorBoard records through the protobuf runtime
"$PY" tests/reference/io_tfevents.py
"$PY" tests/reference/io_safetensors.py
# TensorBoard's own reader: our writer's event file (fixed clock), then EventAccumulator's view of it
OLMOSFT_WRITE_TB_FIXTURE=1 "$BUILD/io_tb_upstream_test" --gtest_filter='*ByteForByte*' >/dev/null
"$REFPY" tests/reference/tb_upstream.py

# --- tok: tokenizer corpus, chat templates, label masks: the pinned upstream oracles of deps/venv-reference
# (HF tokenizers 0.23.3 on deps/dolma2/allenai_dolma2.json, jinja2 3.1.6)
"$REFPY" tests/reference/tok_corpus.py
"$REFPY" tests/reference/tok_long_runs.py
"$REFPY" tests/reference/tok_templates.py
"$REFPY" tests/reference/tok_labels.py

# --- data: JSONL and Parquet (DuckDB CLI, pyarrow) fixtures of the same conversations (build venv)
deps/venv/bin/python tests/reference/data_fixtures.py

# --- model (tests/golden/model/): Olmo 3 dense and Olmo 3.5 hybrid references
"$PY" tests/reference/model_olmo3.py
"$PY" tests/reference/model_olmo3moe.py
"$PY" tests/reference/model_forward_inputs.py  # e2e inputs for `olmosft forward`, from olmo3_tiny
# upstream oracle: transformers' Olmo3ForCausalLM -> hf_olmo3_tiny (save_pretrained + logits/CE) and
# hf_olmo3_export (sha256 + transformers' log-probs of our fp32/bf16 exports of olmo3_tiny)
"$REFPY" tests/reference/hf_olmo3.py --olmosft "$OLMOSFT"
# upstream oracle: transformers' OlmoHybridForCausalLM (torch GDN fallbacks) -> hf_olmo_hybrid/{rope_negeig,
# nope_poseig,gva} (save_pretrained as written + per-document log-probs, CE and float64 gradients)
"$REFPY" tests/reference/hf_olmo_hybrid.py
# hf_olmo_hybrid_export (sha256 + transformers' log-probs of our fp32/bf16 exports of hf_olmo_hybrid/rope_negeig)
"$REFPY" tests/reference/hf_olmo_hybrid_export.py --olmosft "$OLMOSFT"
# upstream oracle: OLMo-core 3.0.0's own TransformerConfig + save_model_and_optim_state (1 process, and 2 with
# torchrun + FSDP2) -> tests/golden/distcp (checkpoints, their tensors, OLMo-core's log-probs). The .metadata
# pickles hold a fresh save id, so a rerun changes those bytes (and only those).
"$REFPY" tests/reference/olmo_core_distcp.py
# upstream oracle: OLMo-core 3.0.0's own OLMoDDPModelConfig (the Olmo 3.5 hybrid) saved by save_model_and_optim_state
# (1 process) and by OLMoDDPTrainModule.save_state_dict_direct (2 processes) -> tests/golden/distcp/hybrid_*, with
# OLMo-core's own HF export and model_olmo3moe.py's log-probs on it (OLMo-core's KDA forward needs a GPU).
"$REFPY" tests/reference/olmo_core_hybrid_distcp.py
# upstream oracle: JAX 0.10.2 lowering jax.nn.dot_product_attention(implementation="cudnn") for the cuda platform
# -> tests/golden/xla/cudnn_fmha (the cuDNN custom calls src/xla/ops_attention_cudnn.cpp emits; deps/venv-jax)
deps/venv-jax/bin/python tests/reference/jax_cudnn_attention.py
if ((check)); then
  "$PY" tests/reference/model_safetensors.py --check
  "$PY" tests/reference/model_olmo3.py --check
  "$PY" tests/reference/model_olmo3moe.py --check
fi
