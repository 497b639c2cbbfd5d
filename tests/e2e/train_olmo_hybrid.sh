#!/usr/bin/env bash
# `olmosft train` on Olmo Hybrid (HF olmo_hybrid: Gated DeltaNet + attention) imported as transformers'
# save_pretrained wrote it: tests/golden/model/hf_olmo_hybrid/rope_negeig (its on-disk names are transformers'
# renamed norms and equal-split conv, mapped by our loader; vocab 320 >= the 260 ids of builtin:bytes),
# fine-tuned on the byte-tokenised golden conversations over 4 epochs, 2 threads. Checks: exit 0; CE falls;
# SIGTERM + resume (remat full, then attn) reproduces the uninterrupted run's (remat none) LOSS-PARTS lines bit
# for bit; the HF export writes the module names (fused conv1d) and loads in `olmosft forward`, fitting the
# training text better than the initial weights.
set -u
export OMP_WAIT_POLICY=passive OPENBLAS_NUM_THREADS=1
bin=$1
dir=$2
root="$(cd "$(dirname "$0")/../.." && pwd)"
G="$root/tests/golden"
init="$G/model/hf_olmo_hybrid/rope_negeig"
rm -rf "$dir" && mkdir -p "$dir"
. "$(dirname "${BASH_SOURCE[0]}")/lib/check.sh"  # pass, fails, check, finish

"$bin" data build --input "$G/data/convs.jsonl" --tokenizer builtin:bytes --seq-len 256 --seed 3 --epochs 4 --quiet \
  --out "$dir/data" >"$dir/build.out" 2>&1
rc=$?
check "dataset builds" "[ $rc -eq 0 ]"
steps=12
cat >"$dir/recipe.yaml" <<YAML
run_name: ref
output_dir: $dir/runs
model:
  init: $init
tokenizer: builtin:bytes
data:
  path: $dir/data
  epochs: 4
seq_len: 256
global_batch: 4
per_device_batch: 2
steps: $steps
optimizer:
  lr: 3e-3
  schedule: constant
  warmup_frac: 0.0
loss:
  lm_z: 1e-5
compute:
  threads: 2
perf:
  peak_tflops: 1
eval:
  heldout: 4
log:
  tensorboard: false
YAML

# 1. The uninterrupted run: CE falls (a model that does not learn stays within ~0.05 over 12 steps).
"$bin" train "$dir/recipe.yaml" >"$dir/ref.out" 2>"$dir/ref.err"
rc=$?
check "olmo_hybrid run exits 0 and reaches the step guard" \
  "[ $rc -eq 0 ] && grep -q 'STEP-GUARD: reached step $steps' '$dir/ref.out'"
[ $rc -eq 0 ] || tail -5 "$dir/ref.err"
grep '^LOSS-PARTS' "$dir/ref.out" >"$dir/ref.loss"
check "$steps LOSS-PARTS lines" "[ \$(wc -l <'$dir/ref.loss') -eq $steps ]"
ces=$(sed 's/.* ce=\([0-9.]*\) .*/\1/' "$dir/ref.loss" | tr '\n' ' ')
echo "CE per step: $ces"
check "CE falls (mean of the last 3 steps < mean of the first 3 - 0.1)" \
  "awk '{ for (i = 1; i <= 3; i++) a += \$i; for (i = NF - 2; i <= NF; i++) b += \$i; exit !(b / 3 < a / 3 - 0.1) }' <<<'$ces'"
check "the FLOP count includes the GDN layers (metrics rows carry mfu > 0)" \
  "jq -e -s 'all(.[]; .mfu > 0 and .tokens_per_s > 0)' '$dir/runs/ref/metrics.jsonl' >/dev/null"

# 2. SIGTERM once step 5 is logged, then resume: recomputation (full, then attn) changes no bit.
"$bin" train "$dir/recipe.yaml" run_name=pre model.remat=full >"$dir/pre.out" 2>"$dir/pre.err" &
pid=$!
for _ in $(seq 1 1200); do grep -q '^LOSS-PARTS step=5 ' "$dir/pre.out" 2>/dev/null && break; sleep 0.05; done
kill -TERM "$pid"
wait "$pid"
rc=$?
check "SIGTERM: exit 143 with a checkpoint" "[ $rc -eq 143 ] && grep -q '^PREEMPTED: SIGTERM; checkpoint of step' '$dir/pre.out'"
"$bin" train "$dir/recipe.yaml" run_name=pre model.remat=attn >"$dir/res.out" 2>"$dir/res.err"
rc=$?
check "resume exits 0 from the preemption checkpoint" "[ $rc -eq 0 ] && grep -q '^RESUME from=' '$dir/res.out'"
cat "$dir/pre.out" "$dir/res.out" | grep '^LOSS-PARTS' | sort -u -V >"$dir/pre.loss"
check "preempted (remat full) + resumed (remat attn) LOSS-PARTS equal the uninterrupted run's, bit for bit" \
  "cmp -s '$dir/pre.loss' '$dir/ref.loss'"
cmp -s "$dir/pre.loss" "$dir/ref.loss" || diff "$dir/ref.loss" "$dir/pre.loss" | head -6

# 3. The HF export: module names (what transformers loads, tests/e2e/hf_export_oracle.sh), and it loads back.
hf="$dir/runs/ref/hf"
check "HF export written" "[ -f '$hf/config.json' ] && grep -q '^EXPORT hf=' '$dir/ref.out'"
names=$(head -c 8 "$hf/model.safetensors" | od -An -tu8 | tr -d ' ')
hdr=$(tail -c +9 "$hf/model.safetensors" | head -c "$names")
check "the export names the fused conv and the module norms (none of transformers' disk aliases)" \
  "jq -e 'has(\"model.layers.0.linear_attn.conv1d.weight\") and has(\"model.layers.0.input_layernorm.weight\")
          and ([keys[] | select(test(\"_conv1d|_layer_norm\"))] | length == 0)' <<<'$hdr' >/dev/null"
text=$(jq -r 'select(.id == "c000") | .messages[-1].content' "$G/data/convs.jsonl")
ids=$(printf '%s' "$text" | od -An -tu1 -v | tr -s ' \n' ' ' | sed 's/^ //; s/ $//; s/ /, /g')
echo "[[$ids]]" >"$dir/tokens.json"
"$bin" forward --model "$hf" --tokens "$dir/tokens.json" --out "$dir/fwd_hf.json" >"$dir/fwd_hf.out" 2>&1
rc=$?
"$bin" forward --model "$init" --tokens "$dir/tokens.json" --out "$dir/fwd_init.json" >"$dir/fwd_init.out" 2>&1
rc2=$?
ce_hf=$(jq .mean_ce "$dir/fwd_hf.json" 2>/dev/null)
ce_init=$(jq .mean_ce "$dir/fwd_init.json" 2>/dev/null)
echo "forward mean CE on c000's answer: export $ce_hf, initial weights $ce_init"
check "olmosft forward loads the export (exit 0, finite CE)" \
  "[ $rc -eq 0 ] && [ $rc2 -eq 0 ] && awk -v a='$ce_hf' 'BEGIN { exit !(a + 0 == a && a > 0) }'"
check "the export fits the training text better than the initial weights" \
  "awk -v a='$ce_hf' -v b='$ce_init' 'BEGIN { exit !(a < b - 0.1) }'"

finish
