#!/usr/bin/env bash
# `olmosft train` from the command line: preflight refusals (zero steps, too few rows, seq_len mismatch, batch
# arithmetic, missing model) with exit 2 before any compute; with a model implementation linked, a short run of
# the tiny Olmo 3 fixture, SIGTERM at an arbitrary step, and a resume that reproduces the uninterrupted run's
# LOSS-PARTS lines exactly.
set -u
bin=$1
dir=$2
root="$(cd "$(dirname "$0")/../.." && pwd)"
G="$root/tests/golden"
rm -rf "$dir" && mkdir -p "$dir"
. "$(dirname "${BASH_SOURCE[0]}")/lib/check.sh"  # pass, fails, check, finish

"$bin" data build --input "$G/data/convs.jsonl" --tokenizer builtin:bytes --seq-len 512 --seed 7 --epochs 2 --quiet \
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
  epochs: 2
seq_len: 512
global_batch: 4
per_device_batch: 2
steps: 4
optimizer:
  lr: 1e-3
perf:
  peak_tflops: 1
checkpoint:
  every: 1
log:
  tensorboard: false
YAML

out=$("$bin" recipe keys); rc=$?
check "recipe keys lists the trainer's keys" "[ $rc -eq 0 ] && grep -q '^export.hf = true' <<<\"\$out\" && grep -q '^perf.peak_tflops' <<<\"\$out\""
err=$("$bin" train "$dir/recipe.yaml" steps=0 2>&1); rc=$?
check "zero steps: exit 2" "[ $rc -eq 2 ] && grep -q 'zero steps' <<<\"\$err\""
err=$("$bin" train "$dir/recipe.yaml" steps=100000 2>&1); rc=$?
check "more steps than the epochs hold: exit 2" "[ $rc -eq 2 ] && grep -q 'steps=100000 needs 400000 rows' <<<\"\$err\""
err=$("$bin" train "$dir/recipe.yaml" seq_len=256 2>&1); rc=$?
check "seq_len mismatch: exit 2" "[ $rc -eq 2 ] && grep -q 'was built with seq_len 512' <<<\"\$err\""
err=$("$bin" train "$dir/recipe.yaml" per_device_batch=3 2>&1); rc=$?
check "batch arithmetic: exit 2" "[ $rc -eq 2 ] && grep -q 'not divisible' <<<\"\$err\""
err=$("$bin" train "$dir/recipe.yaml" data.epochs=3 2>&1); rc=$?
check "more epochs than built: exit 2" "[ $rc -eq 2 ] && grep -q 'data.epochs=3 but dataset' <<<\"\$err\""
err=$("$bin" train "$dir/recipe.yaml" lr=1 2>&1); rc=$?
check "unknown key: exit 2 with a suggestion" "[ $rc -eq 2 ] && grep -q \"did you mean 'optimizer.lr'\" <<<\"\$err\""

"$bin" train "$dir/recipe.yaml" >"$dir/ref.out" 2>"$dir/ref.err"; rc=$?
check "reference run exits 0" "[ $rc -eq 0 ]"
check "reference run logs 4 LOSS-PARTS lines and reaches the step guard" \
  "[ \$(grep -c '^LOSS-PARTS step=' '$dir/ref.out') -eq 4 ] && grep -q 'STEP-GUARD: reached step 4' '$dir/ref.out'"
check "end-of-run checks and export" "grep -q '^CHECK trained_eos count=' '$dir/ref.out' && grep -q '^CHECK step1_ce=' '$dir/ref.out' && [ -f '$dir/runs/e2e/hf/config.json' ]"
# Preempt a second run with SIGTERM once step 2 is logged, then resume it.
"$bin" train "$dir/recipe.yaml" run_name=pre >"$dir/pre.out" 2>"$dir/pre.err" &
pid=$!
for _ in $(seq 1 600); do grep -q '^LOSS-PARTS step=2 ' "$dir/pre.out" 2>/dev/null && break; sleep 0.1; done
# The stop signals are taken on one thread of their own (core/signals.h): the main thread (and every thread
# started after it blocked them) blocks SIGTERM (bit 15 of SigBlk); the routed thread does not, nor do
# threads a library started before main (Debian's pthread OpenBLAS starts its pool when it loads).
unblocked=0 main_blocks=0 seen=0
for st in /proc/"$pid"/task/*/status; do
  m=$(awk '/^SigBlk:/{print $2}' "$st" 2>/dev/null)
  [ -n "$m" ] || continue
  seen=1
  if (((0x$m & 0x4000) == 0)); then unblocked=$((unblocked + 1)); elif [ "$st" == /proc/$pid/task/$pid/status ]; then main_blocks=1; fi
done
check "the trainer's main thread blocks SIGTERM and another thread takes it (or the run had finished)" \
  "[ $seen -eq 0 ] || { [ $unblocked -ge 1 ] && [ $main_blocks -eq 1 ]; }"
kill -TERM "$pid"
wait "$pid"; rc=$?
check "SIGTERM: exit 143 (or 0 if it had already finished)" "[ $rc -eq 143 ] || [ $rc -eq 0 ]"
"$bin" train "$dir/recipe.yaml" run_name=pre >"$dir/res.out" 2>"$dir/res.err"; rc=$?
check "resume exits 0" "[ $rc -eq 0 ]"
check "the resume reads the run's stored peak (MFU denominator fixed per run)" "grep -q '^PREFLIGHT peak_flops=.*read from .*/runs/pre/peak_flops.json' '$dir/res.out'"
check "metrics rows carry the step's model FLOPs" "tail -1 '$dir/runs/pre/metrics.jsonl' | grep -q '\"model_flops\":[1-9]'"
cat "$dir/pre.out" "$dir/res.out" | grep '^LOSS-PARTS' | sort -u -V >"$dir/pre.loss"
grep '^LOSS-PARTS' "$dir/ref.out" >"$dir/ref.loss"
check "preempted + resumed LOSS-PARTS equal the uninterrupted run's" "cmp -s '$dir/pre.loss' '$dir/ref.loss'"
finish
