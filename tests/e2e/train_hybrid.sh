#!/usr/bin/env bash
# `olmosft train` on the Olmo 3.5 hybrid (KDA + MoE): the D.2 tiny fixture (tests/golden/model/olmo3moe_tiny,
# vocab 512 >= the 260 ids of builtin:bytes) fine-tuned on the byte-tokenised golden conversations repeated over
# 4 epochs, 2 threads fixed by compute.threads. Checks: exit 0; every LOSS-PARTS line has non-zero moe_lb and
# router_z; CE falls; metrics.jsonl carries one moe_dropped_tokens / moe_required_buffer_factor entry per MoE
# layer (dropless: no drops, factor >= 1); moe.buffer_factor=1.0 drops tokens; SIGTERM + resume reproduces the
# uninterrupted LOSS-PARTS lines exactly; the HF export loads in `olmosft forward` and fits the training text
# better than the initial weights.
set -u
# On a shared machine (load above the core count) spinning OpenMP and OpenBLAS worker threads made this test's
# steps ~40x slower (measured: tiny hybrid step 5.5 s -> 0.13 s at load 12 on 2 cores); results are the same.
export OMP_WAIT_POLICY=passive OPENBLAS_NUM_THREADS=1
bin=$1
dir=$2
root="$(cd "$(dirname "$0")/../.." && pwd)"
G="$root/tests/golden"
init="$G/model/olmo3moe_tiny"
rm -rf "$dir" && mkdir -p "$dir"
pass=0
fails=0
check() { if eval "$2"; then echo "ok: $1"; pass=$((pass + 1)); else echo "FAIL: $1"; fails=$((fails + 1)); fi; }

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
  moe_lb: 0.01
  router_z: 1e-5
compute:
  threads: 2
perf:
  peak_tflops: 1
eval:
  heldout: 4
log:
  tensorboard: false
YAML
layers=$(jq '.num_hidden_layers' "$init/config.json")
moe_layers=$(jq '.num_hidden_layers - (.dense_layers_indices | length)' "$init/config.json")

# 1. The uninterrupted run.
t0=$(date +%s.%N)
"$bin" train "$dir/recipe.yaml" >"$dir/ref.out" 2>"$dir/ref.err"
rc=$?
t1=$(date +%s.%N)
echo "reference run: exit $rc, $(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }') s"
check "hybrid run exits 0 and reaches the step guard" "[ $rc -eq 0 ] && grep -q 'STEP-GUARD: reached step $steps' '$dir/ref.out'"
grep '^LOSS-PARTS' "$dir/ref.out" >"$dir/ref.loss"
check "$steps LOSS-PARTS lines" "[ \$(wc -l <'$dir/ref.loss') -eq $steps ]"
check "every LOSS-PARTS line has moe_lb > 0 and router_z > 0" \
  "awk '{ for (i = 1; i <= NF; i++) { split(\$i, kv, \"=\"); v[kv[1]] = kv[2] } if (!(v[\"moe_lb\"] > 0 && v[\"router_z\"] > 0)) bad++ }
        END { exit bad > 0 || NR == 0 }' '$dir/ref.loss'"
# CE: the mean of the last 3 steps must be below the mean of the first 3 by > 0.1 nats (measured: ~5.6 -> ~3.4
# over 12 steps at lr 3e-3 on text the model sees 4 times; a model that does not learn stays within ~0.05).
ces=$(sed 's/.* ce=\([0-9.]*\) .*/\1/' "$dir/ref.loss" | tr '\n' ' ')
echo "CE per step: $ces"
check "CE falls (mean of the last 3 steps < mean of the first 3 - 0.1)" \
  "awk '{ for (i = 1; i <= 3; i++) a += \$i; for (i = NF - 2; i <= NF; i++) b += \$i; exit !(b / 3 < a / 3 - 0.1) }' <<<'$ces'"
m="$dir/runs/ref/metrics.jsonl"
check "metrics.jsonl has $steps rows" "[ \$(wc -l <'$m') -eq $steps ]"
check "per-MoE-layer arrays of length $moe_layers ($layers layers, layer 0 dense) on every row" \
  "jq -e -s 'all(.[]; (.moe_dropped_tokens | length) == $moe_layers and (.moe_required_buffer_factor | length) == $moe_layers)' '$m' >/dev/null"
check "dropless (moe.buffer_factor=-1): no dropped tokens, required buffer factor >= 1" \
  "jq -e -s 'all(.[]; all(.moe_dropped_tokens[]; . == 0) and all(.moe_required_buffer_factor[]; . >= 1))' '$m' >/dev/null"
check "metrics rows carry mfu > 0 and tokens_per_s > 0" "jq -e -s 'all(.[]; .mfu > 0 and .tokens_per_s > 0)' '$m' >/dev/null"

# 1b. model.saved_dtype=bf16: the same run with the kept activations rounded to bf16 (docs/model.md). The
#     forward is fp32, so step 1's loss is identical; later steps drift by the rounding of the gradients.
"$bin" train "$dir/recipe.yaml" run_name=bf16 model.saved_dtype=bf16 >"$dir/bf16.out" 2>"$dir/bf16.err"
rc=$?
grep '^LOSS-PARTS' "$dir/bf16.out" >"$dir/bf16.loss"
# Measured (2 threads): the largest per-step difference is 2.7% of the CE (0.11 nats at step 7 of this lr
# 3e-3 constant run, where a step's update is large), the mean of the last 3 steps differs by 1.0%; the bounds
# are 6% and 3%. Both runs learn (the CE-falls check above holds for either).
paste -d' ' <(sed 's/.* ce=\([0-9.]*\) .*/\1/' "$dir/ref.loss") <(sed 's/.* ce=\([0-9.]*\) .*/\1/' "$dir/bf16.loss") \
  >"$dir/bf16.cmp"
drift=$(awk '{ d = ($1 - $2) / $1; if (d < 0) d = -d; if (d > m) m = d } END { printf "%.4f", m }' "$dir/bf16.cmp")
tail3=$(tail -3 "$dir/bf16.cmp" | awk '{ a += $1; b += $2 } END { d = (a - b) / a; if (d < 0) d = -d; printf "%.4f", d }')
echo "saved_dtype=bf16 vs fp32 over $steps steps: largest relative CE difference $drift, last-3 mean $tail3"
check "saved_dtype=bf16 run exits 0, step 1 loss identical to fp32's" \
  "[ $rc -eq 0 ] && [ \"\$(head -1 '$dir/bf16.loss')\" == \"\$(head -1 '$dir/ref.loss')\" ]"
check "saved_dtype=bf16: per-step CE within 6% of fp32's (not identical), last-3 mean within 3%" \
  "awk -v d='$drift' -v t='$tail3' 'BEGIN { exit !(d > 0 && d < 0.06 && t < 0.03) }'"

# 1c. compute.dtype=bf16: the weight GEMMs (projections, experts, LM head) take bf16-rounded operands with fp32
#     sums (oneDNN); everything else is fp32. Step 1's loss moves by the forward's rounding only; later steps
#     drift further. Measured (2 threads, this lr 3e-3 constant run): step 1 0.023%, largest per-step gap 2.5%,
#     last-3 mean 2.0%. Bounds: step 1 within 1% (and not 0: the rounding is applied), 6%, 5%.
if "$bin" selfcheck 2>/dev/null | grep -q 'bf16 unsupported here'; then
  echo "skipped: compute.dtype=bf16 (this CPU has no oneDNN bf16 matmul)"
else
  "$bin" train "$dir/recipe.yaml" run_name=c16 compute.dtype=bf16 >"$dir/c16.out" 2>"$dir/c16.err"
  rc=$?
  grep '^LOSS-PARTS' "$dir/c16.out" >"$dir/c16.loss"
  paste -d' ' <(sed 's/.* ce=\([0-9.]*\) .*/\1/' "$dir/ref.loss") <(sed 's/.* ce=\([0-9.]*\) .*/\1/' "$dir/c16.loss") \
    >"$dir/c16.cmp"
  first=$(head -1 "$dir/c16.cmp" | awk '{ d = ($1 - $2) / $1; if (d < 0) d = -d; printf "%.5f", d }')
  drift=$(awk '{ d = ($1 - $2) / $1; if (d < 0) d = -d; if (d > m) m = d } END { printf "%.4f", m }' "$dir/c16.cmp")
  tail3=$(tail -3 "$dir/c16.cmp" | awk '{ a += $1; b += $2 } END { d = (a - b) / a; if (d < 0) d = -d; printf "%.4f", d }')
  echo "compute.dtype=bf16 vs fp32 over $steps steps: step 1 $first, largest relative CE difference $drift, last-3 mean $tail3"
  check "compute.dtype=bf16 run exits 0 with $steps steps" "[ $rc -eq 0 ] && [ \$(wc -l <'$dir/c16.loss') -eq $steps ]"
  check "compute.dtype=bf16: step 1 within 1% of fp32 (not equal), per-step CE within 6%, last-3 mean within 5%" \
    "awk -v f='$first' -v d='$drift' -v t='$tail3' 'BEGIN { exit !(f > 0 && f < 0.01 && d < 0.06 && t < 0.05) }'"
  check "compute.dtype=bf16 is recorded: peak_flops.json names the set-up" \
    "jq -e '.gemm | startswith(\"fp32=\") and contains(\"compute=bf16\")' '$dir/runs/c16/peak_flops.json' >/dev/null"
fi

# 2. Capacity 1.0: some (token, slot) assignments are dropped where a layer's load is uneven.
"$bin" train "$dir/recipe.yaml" run_name=bf1 steps=2 moe.buffer_factor=1.0 >"$dir/bf1.out" 2>"$dir/bf1.err"
rc=$?
check "buffer_factor=1.0 run exits 0" "[ $rc -eq 0 ]"
echo "buffer_factor=1.0 step 1: dropped $(head -1 "$dir/runs/bf1/metrics.jsonl" | jq -c .moe_dropped_tokens)," \
  "required $(head -1 "$dir/runs/bf1/metrics.jsonl" | jq -c '[.moe_required_buffer_factor[] | . * 100 | round / 100]')"
check "buffer_factor=1.0: dropped tokens > 0, and only in layers whose required factor > 1" \
  "jq -e -s 'all(.[]; [.moe_dropped_tokens, .moe_required_buffer_factor] | transpose | all(.[]; .[0] == 0 or .[1] > 1))
             and (map(.moe_dropped_tokens | add) | add) > 0' '$dir/runs/bf1/metrics.jsonl' >/dev/null"

# 3. SIGTERM once step 5 is logged, then resume: the LOSS-PARTS lines equal the uninterrupted run's. The
#    interrupted run recomputes every block (model.remat=full), the resumed one only the mixers (attn), the
#    reference none: recomputation changes no bit, and remat may change on resume (an operational key).
"$bin" train "$dir/recipe.yaml" run_name=pre model.remat=full >"$dir/pre.out" 2>"$dir/pre.err" &
pid=$!
for _ in $(seq 1 1200); do grep -q '^LOSS-PARTS step=5 ' "$dir/pre.out" 2>/dev/null && break; sleep 0.05; done
kill -TERM "$pid"
wait "$pid"
rc=$?
check "SIGTERM: exit 143 with a checkpoint" "[ $rc -eq 143 ] && grep -q '^PREEMPTED: SIGTERM; checkpoint of step' '$dir/pre.out'"
echo "preempted after step $(sed -n 's/^PREEMPTED: SIGTERM; checkpoint of step \([0-9]*\).*/\1/p' "$dir/pre.out")"
"$bin" train "$dir/recipe.yaml" run_name=pre model.remat=attn >"$dir/res.out" 2>"$dir/res.err"
rc=$?
check "resume exits 0 from the preemption checkpoint" "[ $rc -eq 0 ] && grep -q '^RESUME from=' '$dir/res.out'"
cat "$dir/pre.out" "$dir/res.out" | grep '^LOSS-PARTS' | sort -u -V >"$dir/pre.loss"
check "preempted (remat full) + resumed (remat attn) LOSS-PARTS equal the uninterrupted run's (none), bit for bit" "cmp -s '$dir/pre.loss' '$dir/ref.loss'"
cmp -s "$dir/pre.loss" "$dir/ref.loss" || diff "$dir/ref.loss" "$dir/pre.loss" | head -6

# 4. The HF export loads back: `olmosft forward` on one training conversation's assistant answer (bytes)
#    gives a lower CE with the exported weights than with the initial ones.
hf="$dir/runs/ref/hf"
check "HF export written" "[ -f '$hf/config.json' ] && grep -q '^EXPORT hf=' '$dir/ref.out'"
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

echo "$pass passed, $fails failed"
[ "$fails" -eq 0 ]
