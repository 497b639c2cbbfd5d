#!/usr/bin/env bash
# The trainer's last evaluation vs a reload of its HF export: a 4-step run of the tiny Olmo 3 fixture prints
# `CHECK eval_ce rows=N targets=M ce=X epoch0_rows=A:B` (CE over the held-out rows, from the same forwards as
# P(EOS)); `olmosft data rows` writes those rows as forward inputs and `olmosft forward --model RUN/hf` must
# give the same trained-target count and mean CE. Tolerance: 1e-7 relative. Both sides are the same fp32
# code on the same weights (the export is fp32); they differ only in batching (the trainer runs one row per
# forward over the padded seq_len, forward runs all rows at once trimmed to their documents), which may change
# GEMM blocking and the order of the CE sum, and in printing (eval_ce has 9 significant digits: <= 5e-9
# relative). Measured: 1.4e-11 relative (1128 targets, 2 threads).
# Then `olmosft generate` runs on the export (smoke: output per prompt, ids inside the tokenizer's vocabulary).
set -u
bin=$1
dir=$2
root="$(cd "$(dirname "$0")/../.." && pwd)"
G="$root/tests/golden"
rm -rf "$dir" && mkdir -p "$dir"
. "$(dirname "${BASH_SOURCE[0]}")/lib/check.sh"  # pass, fails, check, finish

"$bin" data build --input "$G/data/convs.jsonl" --tokenizer builtin:bytes --seq-len 512 --seed 7 --epochs 1 --quiet \
  --out "$dir/data" >/dev/null 2>&1; rc=$?
check "dataset builds" "[ $rc -eq 0 ]"
cat >"$dir/recipe.yaml" <<YAML
run_name: e2e
output_dir: $dir/runs
model:
  init: $G/model/olmo3_tiny
tokenizer: builtin:bytes
data:
  path: $dir/data
  epochs: 1
seq_len: 512
global_batch: 4
per_device_batch: 2
steps: 3
optimizer:
  lr: 1e-3
perf:
  peak_tflops: 1
checkpoint:
  every: 0
log:
  tensorboard: false
eval:
  heldout: 6
YAML
"$bin" train "$dir/recipe.yaml" >"$dir/train.out" 2>"$dir/train.err"; rc=$?
check "training exits 0" "[ $rc -eq 0 ]"
line=$(grep '^CHECK eval_ce ' "$dir/train.out")
echo "trainer: $line"
rows=$(sed -n 's/.* rows=\([0-9]*\) .*/\1/p' <<<"$line")
targets=$(sed -n 's/.* targets=\([0-9]*\) .*/\1/p' <<<"$line")
ce=$(sed -n 's/.* ce=\([0-9.eE+-]*\) .*/\1/p' <<<"$line")
range=$(sed -n 's/.* epoch0_rows=\([0-9]*:[0-9]*\).*/\1/p' <<<"$line")
check "CHECK eval_ce line: 6 held-out rows (12:18, after the 12 trained rows), targets > 0" \
  "[ '$rows' = 6 ] && [ '$range' = 12:18 ] && [ '${targets:-0}' -gt 0 ] && grep -q '^CHECK p_eos rows=6 (held out)' '$dir/train.out'"
check "HF export written" "[ -f '$dir/runs/e2e/hf/config.json' ]"
"$bin" data rows --data "$dir/data" --epoch 0 --rows "$range" --out-dir "$dir/rows" >/dev/null; rc=$?
check "data rows writes the forward inputs" \
  "[ $rc -eq 0 ] && [ \$(jq length '$dir/rows/tokens.json') -eq 6 ] && [ -f '$dir/rows/segments.json' ] && [ -f '$dir/rows/trained.json' ]"
"$bin" forward --model "$dir/runs/e2e/hf" --tokens "$dir/rows/tokens.json" --segments "$dir/rows/segments.json" \
  --trained "$dir/rows/trained.json" --out "$dir/fwd.json" >/dev/null; rc=$?
check "forward on the reloaded export exits 0" "[ $rc -eq 0 ]"
fwd_targets=$(jq .trained_targets "$dir/fwd.json")
fwd_ce=$(jq .mean_ce "$dir/fwd.json")
echo "forward on $dir/runs/e2e/hf: targets=$fwd_targets mean_ce=$fwd_ce"
check "same trained targets" "[ '$fwd_targets' = '$targets' ]"
check "reloaded export's mean CE = trainer's eval_ce within 1e-7 relative" \
  "awk -v a='$ce' -v b='$fwd_ce' 'BEGIN { d = a - b; if (d < 0) d = -d; r = d / b; printf \"relative difference %.3g\\n\", r; exit !(r < 1e-7) }'"
# The final weights are not the initial ones: the export is the trained model.
"$bin" forward --model "$G/model/olmo3_tiny" --tokens "$dir/rows/tokens.json" --segments "$dir/rows/segments.json" \
  --trained "$dir/rows/trained.json" --out "$dir/fwd0.json" >/dev/null
check "the fixture's initial weights give another CE" "[ \"\$(jq .mean_ce '$dir/fwd0.json')\" != '$fwd_ce' ]"

printf '%s\n' '{"id": "a", "messages": [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "hi"}]}' \
  '{"messages": [{"role": "user", "content": "what?"}]}' >"$dir/prompts.jsonl"
"$bin" generate --model "$dir/runs/e2e/hf" --tokenizer builtin:bytes --prompts "$dir/prompts.jsonl" \
  --out "$dir/gen.jsonl" --max-new-tokens 5 >"$dir/gen.out"; rc=$?
check "generate on the export: one line per prompt, <= 5 ids below 260, reference echoed" \
  "[ $rc -eq 0 ] && [ \$(wc -l <'$dir/gen.jsonl') -eq 2 ] && jq -e -s 'all(.[]; (.tokens | length) <= 5 and all(.tokens[]; . < 260)) and .[0].reference == \"hi\" and .[0].id == \"a\" and (.[1] | has(\"reference\") | not)' '$dir/gen.jsonl' >/dev/null"
finish
