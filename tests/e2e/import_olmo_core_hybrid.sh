#!/usr/bin/env bash
# `olmosft import olmo-core STEP_DIR --config CONFIG_JSON --out HF_DIR`, `olmosft forward` and model.init on
# checkpoints of the Olmo 3.5 hybrid (HF olmo3moe: KDA + softmax attention + latent MoE) written by OLMo-core 3.0.0's
# own code (tests/golden/distcp/hybrid_*, made by tests/reference/olmo_core_hybrid_distcp.py; no Python here):
#   hybrid_1proc         save_model_and_optim_state, 1 process, float32 ("model.<name>")
#   hybrid_direct_2proc  OLMoDDPTrainModule.save_state_dict_direct, 2 processes ("module.<name>.main", flat fp32
#                        masters of bfloat16 parameters, split over both ranks' files): the hybrid trainer's layout
# 1. both import, `model info` reads the step directory and the import, and our forward on the import reproduces
#    the log-probs of the independent PyTorch reference tests/reference/model_olmo3moe.py (float64) run on
#    OLMo-core's own HF export of the same weights: max |diff| <= 5e-5 per position and mean CE within 1e-6.
#    OLMo-core's own forward is not the oracle here: its KDA layer runs FLA's Triton kernels, which need a GPU.
#    The comparison discriminates: the import with linear_allow_neg_eigval off is > 1e-3 away;
# 2. `olmosft train` with model.init = the 2-process step directory starts from its weights;
# 3. a config that does not match the tensors exits 2 naming the checkpoint tensor, writing nothing.
set -u
bin=$1
tmp=$2
rm -rf "$tmp" && mkdir -p "$tmp"
here=$(cd "$(dirname "$0")/../.." && pwd)
gold=$here/tests/golden/distcp
. "$(dirname "${BASH_SOURCE[0]}")/lib/check.sh"  # pass, fails, check, finish
near() { awk -v a="$1" -v b="$2" -v tol="$3" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= tol) }'; }
maxdiff() {  # max |a - b| over the positions of two logprobs arrays; 1e9 when the null positions differ
  jq -n --slurpfile a "$1" --slurpfile b "$2" '[ ([$a[0].logprobs | .[][]] | to_entries) as $x
    | [$b[0].logprobs | .[][]] as $y | $x[] | select(.value != null or $y[.key] != null)
    | if (.value == null or $y[.key] == null) then 1e9 else ((.value - $y[.key]) | fabs) end ] | max'
}

for p in 1proc direct_2proc; do
  step=$gold/hybrid_$p
  want=$gold/oracle/expected_hybrid_${p#direct_}.json
  "$bin" import olmo-core "$step" --config "$step/config.json" --out "$tmp/hf_$p" >"$tmp/import_$p.out" 2>&1
  check "$p: import exits 0" "[ $? -eq 0 ]"
  check "$p: progress with rate and ETA" "grep -q 'import: 169/169 tensors, .* MB/s, ETA' '$tmp/import_$p.out'"
  check "$p: the import is olmo3moe" "[ \"\$(jq -r .model_type '$tmp/hf_$p/config.json')\" = olmo3moe ]"
  "$bin" model info "$tmp/hf_$p" >"$tmp/info_$p.out" 2>&1
  check "$p: model info on the import" "[ $? -eq 0 ] && grep -q 'tensors             169' '$tmp/info_$p.out'"
  "$bin" model info "$step" >"$tmp/info_step_$p.out" 2>&1
  check "$p: model info on the step directory" \
    "[ $? -eq 0 ] && grep -q 'OLMo-core distributed checkpoint' '$tmp/info_step_$p.out'"
  "$bin" forward --model "$tmp/hf_$p" --tokens "$gold/oracle/tokens.json" --out "$tmp/fwd_$p.json" >/dev/null 2>&1
  check "$p: forward on the import exits 0" "[ $? -eq 0 ]"
  m=$(maxdiff "$tmp/fwd_$p.json" "$want")
  echo "$p: log-probs max |olmosft - reference on OLMo-core's HF export| = $m"
  check "$p: log-probs within 5e-5 of the reference" "near '$m' 0 5e-5"
  ce=$(jq .mean_ce "$tmp/fwd_$p.json")
  ref=$(jq .mean_ce "$want")
  check "$p: mean CE $ce within 1e-6 of the reference's $ref" "near '$ce' '$ref' 1e-6"
done
cp -r "$tmp/hf_1proc" "$tmp/hf_posbeta"
jq '.linear_allow_neg_eigval = false' "$tmp/hf_1proc/config.json" >"$tmp/hf_posbeta/config.json"
"$bin" forward --model "$tmp/hf_posbeta" --tokens "$gold/oracle/tokens.json" --out "$tmp/fwd_nr.json" >/dev/null 2>&1
m=$(maxdiff "$tmp/fwd_nr.json" "$gold/oracle/expected_hybrid_1proc.json")
check "the comparison discriminates: KDA beta in (0, 1) instead of (0, 2) is $m > 1e-3 away" \
  "awk -v m='$m' 'BEGIN { exit !(m > 1e-3 && m < 1e8) }'"

# --- model.init accepts the hybrid step directory (flat .main masters): train starts from its weights
G=$here/tests/golden
"$bin" data build --input "$G/data/convs.jsonl" --tokenizer builtin:bytes --seq-len 512 --seed 7 --epochs 1 \
  --quiet --out "$tmp/data" >/dev/null 2>&1
check "dataset builds" "[ $? -eq 0 ]"
cat >"$tmp/recipe.yaml" <<YAML
run_name: distcp-hybrid
output_dir: $tmp/runs
model:
  init: $gold/hybrid_direct_2proc
tokenizer: builtin:bytes
data:
  path: $tmp/data
  epochs: 1
seq_len: 512
global_batch: 2
per_device_batch: 2
steps: 2
optimizer:
  lr: 1e-3
perf:
  peak_tflops: 1
checkpoint:
  every: 0
log:
  tensorboard: false
eval:
  heldout: 2
YAML
"$bin" train "$tmp/recipe.yaml" >"$tmp/train.out" 2>"$tmp/train.err"
rc=$?
check "train with model.init = the hybrid step directory exits 0 (exit $rc: $(tail -c 300 "$tmp/train.err" | tr '\n' ' '))" \
  "[ $rc -eq 0 ]"
step1=$(sed -n 's/^CHECK step1_ce=\([0-9.]*\).*/\1/p' "$tmp/train.out")
"$bin" data rows --data "$tmp/data" --epoch 0 --rows 0:2 --out-dir "$tmp/rows" >/dev/null
"$bin" forward --model "$tmp/hf_direct_2proc" --tokens "$tmp/rows/tokens.json" \
  --segments "$tmp/rows/segments.json" --trained "$tmp/rows/trained.json" --out "$tmp/step1.json" >/dev/null
ce=$(jq .mean_ce "$tmp/step1.json")
check "the run's step-1 CE $step1 is the imported model's $ce (it started from the checkpoint)" \
  "[ -n '$step1' ] && near '$step1' '$ce' 1e-6"

# --- a config that does not match the tensors: exit 2, the checkpoint tensor named, nothing written
jq '.model.block.kda.routed_experts.hidden_size = 12 | .model.block.attn.routed_experts.hidden_size = 12' \
  "$gold/hybrid_direct_2proc/config.json" >"$tmp/bad.json"
"$bin" import olmo-core "$gold/hybrid_direct_2proc" --config "$tmp/bad.json" --out "$tmp/out_bad" >"$tmp/bad.out" 2>&1
rc=$?
check "mismatched config refused naming the tensor (exit $rc: $(head -c 300 "$tmp/bad.out" | tr '\n' ' '))" \
  "[ $rc -eq 2 ] && grep -qF 'module.blocks.1.routed_experts.w_up_gate.main' '$tmp/bad.out'"
check "nothing written by the failed import" "[ ! -e '$tmp/out_bad' ]"

[ $fails -eq 0 ] && rm -rf "$tmp"
finish
