#!/usr/bin/env bash
# `olmosft import olmo-core STEP_DIR --config CONFIG_JSON --out HF_DIR` then `olmosft forward` on the result, on
# checkpoints written by OLMo-core 3.0.0's own save_model_and_optim_state (tests/golden/distcp, made by
# tests/reference/olmo_core_distcp.py; no Python here):
#   1. both fixtures (1 process fp32; 2 processes, FSDP2-split, bf16) import, `model info` reads the step
#      directory and the import, and our forward on the import reproduces OLMo-core's own forward log-probs:
#      max |diff| <= 5e-5 per position and mean CE within 1e-6 (the tolerances of the transformers oracle,
#      tests/e2e/hf_export_oracle.sh); for the 1-process model also transformers' Olmo3ForCausalLM on OLMo-core's
#      own HF conversion (save_hf_model); the comparison discriminates: the same import with the sliding window
#      off by one (7 instead of OLMo-core's 6) is > 1e-3 away;
#   2. `olmosft train` with model.init = the step directory starts from the checkpoint's weights;
#   3. hostile or damaged inputs exit 2 with a message naming the file and the problem, and write nothing:
#      a .metadata whose pickle names os.system (GLOBAL + REDUCE, and STACK_GLOBAL), a truncated shard,
#      a damaged .metadata, a config that does not match the tensors, an output directory that is not empty.
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
# expect_fail NAME OUTFILE NEEDLE...: exit code 2 and every needle in the message
expect_fail() {
  local name=$1 rc=$2 out=$3
  shift 3
  local ok=1 n
  [ "$rc" -eq 2 ] || ok=0
  for n in "$@"; do grep -qF -- "$n" "$out" || ok=0; done
  check "$name (exit $rc: $(head -c 300 "$out" | tr '\n' ' '))" "[ $ok -eq 1 ]"
}

for p in 1proc 2proc; do
  step=$gold/olmo3_$p
  "$bin" import olmo-core "$step" --config "$step/config.json" --out "$tmp/hf_$p" >"$tmp/import_$p.out" 2>&1
  rc=$?
  check "$p: import exits 0" "[ $rc -eq 0 ]"
  check "$p: progress with rate and ETA" "grep -q 'import: 47/47 tensors, .* MB/s, ETA' '$tmp/import_$p.out'"
  "$bin" model info "$tmp/hf_$p" >"$tmp/info_$p.out" 2>&1
  check "$p: model info on the import" "[ $? -eq 0 ] && grep -q 'tensors             47' '$tmp/info_$p.out'"
  "$bin" model info "$step" >"$tmp/info_step_$p.out" 2>&1
  check "$p: model info on the step directory" \
    "[ $? -eq 0 ] && grep -q 'OLMo-core distributed checkpoint' '$tmp/info_step_$p.out'"
  "$bin" forward --model "$tmp/hf_$p" --tokens "$gold/oracle/tokens.json" --out "$tmp/fwd_$p.json" >/dev/null 2>&1
  check "$p: forward on the import exits 0" "[ $? -eq 0 ]"
  m=$(maxdiff "$tmp/fwd_$p.json" "$gold/oracle/expected_$p.json")
  echo "$p: log-probs max |olmosft - OLMo-core| = $m"
  check "$p: log-probs within 5e-5 of OLMo-core's forward" "near '$m' 0 5e-5"
  ce=$(jq .mean_ce "$tmp/fwd_$p.json")
  ref=$(jq .mean_ce "$gold/oracle/expected_$p.json")
  check "$p: mean CE $ce within 1e-6 of OLMo-core's $ref" "near '$ce' '$ref' 1e-6"
done
# transformers' Olmo3ForCausalLM on OLMo-core's own HF conversion of the same model (a second upstream oracle)
m=$(maxdiff "$tmp/fwd_1proc.json" "$gold/oracle/olmo_core_hf_1proc.json")
echo "1proc: log-probs max |olmosft - transformers on OLMo-core's HF conversion| = $m"
check "1proc: log-probs within 5e-5 of transformers' on OLMo-core's own HF conversion" "near '$m' 0 5e-5"
cp -r "$tmp/hf_1proc" "$tmp/hf_window7"
jq '.sliding_window = 7' "$tmp/hf_1proc/config.json" >"$tmp/hf_window7/config.json"
"$bin" forward --model "$tmp/hf_window7" --tokens "$gold/oracle/tokens.json" --out "$tmp/fwd_w7.json" >/dev/null 2>&1
m=$(maxdiff "$tmp/fwd_w7.json" "$gold/oracle/expected_1proc.json")
check "the comparison discriminates: a window off by one (7) is $m > 1e-3 away from OLMo-core" \
  "awk -v m='$m' 'BEGIN { exit !(m > 1e-3 && m < 1e8) }'"

# --- model.init accepts the step directory: `olmosft train` starts from the checkpoint's weights (its step-1
# CE, printed to 6 decimals, is our forward's CE on the step-1 rows of the imported model)
G=$here/tests/golden
"$bin" data build --input "$G/data/convs.jsonl" --tokenizer builtin:bytes --seq-len 512 --seed 7 --epochs 1 \
  --quiet --out "$tmp/data" >/dev/null 2>&1
check "dataset builds" "[ $? -eq 0 ]"
cat >"$tmp/recipe.yaml" <<YAML
run_name: distcp
output_dir: $tmp/runs
model:
  init: $gold/olmo3_2proc
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
check "train with model.init = the OLMo-core step directory exits 0" "[ $? -eq 0 ]"
step1=$(sed -n 's/^CHECK step1_ce=\([0-9.]*\).*/\1/p' "$tmp/train.out")
"$bin" data rows --data "$tmp/data" --epoch 0 --rows 0:2 --out-dir "$tmp/rows" >/dev/null
"$bin" forward --model "$tmp/hf_2proc" --tokens "$tmp/rows/tokens.json" --segments "$tmp/rows/segments.json" \
  --trained "$tmp/rows/trained.json" --out "$tmp/step1.json" >/dev/null
ce=$(jq .mean_ce "$tmp/step1.json")
check "the run's step-1 CE $step1 is the imported model's $ce (it started from the checkpoint)" \
  "[ -n '$step1' ] && near '$step1' '$ce' 1e-6"

# --- hostile and damaged inputs: exit 2, the file and the problem named, nothing written
bad() {  # bad NAME: a fresh copy of the 1-process step directory at $tmp/NAME
  rm -rf "${tmp:?}/$1" && cp -r "$gold/olmo3_1proc" "$tmp/$1"
}
run_import() { "$bin" import olmo-core "$1" --config "$1/config.json" --out "$2" >"$3" 2>&1; }

bad os_global
printf '\x80\x02cos\nsystem\nX\x05\x00\x00\x00touch\x85R.' >"$tmp/os_global/model_and_optim/.metadata"
run_import "$tmp/os_global" "$tmp/out_os" "$tmp/os_global.out"
expect_fail "GLOBAL os.system + REDUCE refused" $? "$tmp/os_global.out" ".metadata" "'os.system' is not allowed"
bad os_stack
printf '\x80\x04\x95\x1f\x00\x00\x00\x00\x00\x00\x00\x8c\x02os\x8c\x06system\x93\x8c\x05touch\x85R.' \
  >"$tmp/os_stack/model_and_optim/.metadata"
run_import "$tmp/os_stack" "$tmp/out_os" "$tmp/os_stack.out"
expect_fail "STACK_GLOBAL os.system refused" $? "$tmp/os_stack.out" ".metadata" "'os.system' is not allowed"
bad trunc
truncate -s 1000 "$tmp/trunc/model_and_optim/__0_2.distcp"
run_import "$tmp/trunc" "$tmp/out_trunc" "$tmp/trunc.out"
expect_fail "truncated shard named" $? "$tmp/trunc.out" "__0_2.distcp" "truncated" "tensor '"
bad meta
head -c 20000 "$gold/olmo3_1proc/model_and_optim/.metadata" >"$tmp/meta/model_and_optim/.metadata"
run_import "$tmp/meta" "$tmp/out_meta" "$tmp/meta.out"
expect_fail "damaged .metadata named" $? "$tmp/meta.out" "model_and_optim/.metadata" "truncated"
bad cfg
sed 's/"n_layers": 4/"n_layers": 3/' "$gold/olmo3_1proc/config.json" >"$tmp/cfg/config.json"
run_import "$tmp/cfg" "$tmp/out_cfg" "$tmp/cfg.out"
expect_fail "config/tensor mismatch names the tensors" $? "$tmp/cfg.out" "unexpected" "model.layers.3."
mkdir -p "$tmp/full" && touch "$tmp/full/x"
run_import "$gold/olmo3_1proc" "$tmp/full" "$tmp/full.out"
expect_fail "non-empty output directory refused" $? "$tmp/full.out" "$tmp/full"
written=$(ls -d "$tmp"/out_* "$tmp"/*.tmp-* 2>/dev/null | wc -l)
check "nothing written by the failed imports ($written entries)" "[ $written -eq 0 ]"

[ $fails -eq 0 ] && rm -rf "$tmp"
finish
