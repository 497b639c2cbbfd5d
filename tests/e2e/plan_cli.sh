#!/usr/bin/env bash
# `olmosft plan` from the command line (docs/plan.md): a fitting plan (exit 0, `PLAN fits=yes`), a refused one
# with its change (exit 1), bad input (exit 2), and `olmosft train` refusing a run that cannot fit BEFORE any
# weight is read (a model directory holding only config.json: had the weights been read, the error would be
# the missing safetensors).
set -u
bin=$1
dir=$2
root="$(cd "$(dirname "$0")/../.." && pwd)"
G="$root/tests/golden"
rm -rf "$dir" && mkdir -p "$dir"
. "$(dirname "${BASH_SOURCE[0]}")/lib/check.sh"  # pass, fails, check, finish

out=$("$bin" plan "$root/recipes/tiny-demo.yaml" --model olmo3-tiny --peak-tflops 1 2>&1); rc=$?
check "a fitting plan exits 0" "[ $rc -eq 0 ]"
check "it prints the parts and the PLAN line" "grep -q 'AdamW moments' <<<\"\$out\" && grep -q '^PLAN fits=yes' <<<\"\$out\""
out=$("$bin" plan "$root/recipes/olmo3-7b-sft.yaml" --model olmo3-7b --device h100-80gb --devices 16 \
  per_device_batch=1 dist.mode=zero3 device=cpu model.remat=none 2>&1); rc=$?
check "a refused plan exits 1" "[ $rc -eq 1 ]"
check "it names the smallest change that fits" "grep -q '^DOES NOT FIT: .*smallest change that fits: ' <<<\"\$out\""
# recipes/olmo-hybrid-7b-sft.yaml (Olmo Hybrid 7B at 65,536-token rows) fits as its header says, on both kinds
for dev in "h100-80gb" "tpu-v4 devices=128 per_device_batch=0.125"; do
  out=$("$bin" plan "$root/recipes/olmo-hybrid-7b-sft.yaml" --model olmo-hybrid-7b --device $dev 2>&1); rc=$?
  check "the olmo_hybrid 7B recipe fits on $dev (GDN layers planned)" \
    "[ $rc -eq 0 ] && grep -q '^PLAN fits=yes' <<<\"\$out\" && grep -q '7430870688 parameters' <<<\"\$out\""
done
# The runbook's recipes plan from the recipe alone where model.init (a cluster volume) cannot be read: the
# preset their model directory's name matches, said once.
for r in olmo35-small-sft:olmo3moe-small olmo3-7b-sft:olmo3-7b; do
  out=$("$bin" plan "$root/recipes/${r%%:*}.yaml" --device tpu-v4 2>&1); rc=$?
  check "${r%%:*}.yaml plans without its checkpoint, from the preset ${r#*:}" \
    "[ $rc -le 1 ] && [ \$(grep -c 'cannot be read here; planning from the preset ${r#*:} ' <<<\"\$out\") -eq 1 ] && grep -q '^PLAN fits=' <<<\"\$out\""
done
out=$("$bin" plan "$root/recipes/tiny-demo.yaml" model.init=/nonexistent/other-model 2>&1); rc=$?
check "a model.init whose name matches no preset is refused naming the file and --model" \
  "[ $rc -eq 2 ] && grep -q 'cannot read /nonexistent/other-model/config.json.*give --model PRESET|config.json' <<<\"\$out\""
# plan --compile refuses a spelling it cannot compile before any plugin loads
out=$("$bin" plan --compile a100:2x8 "$root/recipes/olmo3-7b-sft.yaml" 2>&1); rc=$?
check "plan --compile with another spelling exits 2 naming it and the GPUs it knows" \
  "[ $rc -eq 2 ] && grep -q \"topology 'a100:2x8': expected tpu-v4:XxYxZ .* or GPU:HOSTSxGPUS .*GPUs: h100, h200, b200\" <<<\"\$out\""
# The GPU twin of the Olmo 3 7B recipe on 2 x 8 H100, compiled by XLA's CUDA plugin without a GPU (make test
# installs it, install-deps.sh --cuda; ~11 s each): each row over a node's 8 GPUs fits; a whole 64K row per
# GPU does not (exit 1, the compiled verdict).
out=$("$bin" plan --compile h100:2x8 "$root/recipes/olmo3-7b-sft.yaml" mesh.fsdp=2 2>&1); rc=$?
grep -a '^compiled for' <<<"$out"
check "the 7B recipe on h100:2x8 with mesh.fsdp=2 compiles without a GPU and fits (exit 0)" \
  "[ $rc -eq 0 ] && grep -Eq '^PLAN compiled=yes topology=h100:2x8 devices=16 mesh=data=1,fsdp=2,expert=1,context=8 B=2 T=65536 .* device_bytes=76448681164 .* fits=yes ' <<<\"\$out\""
check "... and the partitioned program has collectives only in its layer scan (PLAN-LOOPS, no PLAN-WARNING)" \
  "grep -Eq '^PLAN-LOOPS layer_scan_collectives=[1-9][0-9]* unwanted_collectives=0$' <<<\"\$out\" && ! grep -q '^PLAN-WARNING' <<<\"\$out\""
out=$("$bin" plan --compile h100:2x8 "$root/recipes/olmo3-7b-sft.yaml" mesh.fsdp=16 mesh.context=1 per_device_batch=1 2>&1); rc=$?
check "a whole 64K row per H100 does not fit (exit 1, fits=no)" \
  "[ $rc -eq 1 ] && grep -Eq '^PLAN compiled=yes topology=h100:2x8 .* fits=no ' <<<\"\$out\""
out=$("$bin" plan --compile tpu-v4:4x4 "$root/recipes/olmo3-7b-sft.yaml" 2>&1); rc=$?
check "plan --compile with a 2-axis v4 slice exits 2 naming it" \
  "[ $rc -eq 2 ] && grep -q 'TPU topology .v4:4x4.: 2 axes, a v4 slice has 3' <<<\"\$out\""
out=$("$bin" plan "$root/recipes/tiny-demo.yaml" --model olmo3-tiny --device h100 2>&1); rc=$?
check "an unknown device exits 2 naming the choices" "[ $rc -eq 2 ] && grep -q \"unknown device 'h100'.*h200-141gb\" <<<\"\$out\""
out=$("$bin" plan "$root/recipes/tiny-demo.yaml" --model olmo3-tiny devices=4 global_batch=2 per_device_batch=0.5 2>&1); rc=$?
check "fractional rows on a CPU exit 2" "[ $rc -eq 2 ] && grep -q 'whole rows' <<<\"\$out\""

"$bin" data build --input "$G/data/convs.jsonl" --tokenizer builtin:bytes --seq-len 256 --seed 7 --quiet \
  --out "$dir/data" >/dev/null 2>&1
mkdir -p "$dir/olmo7b"
"$bin" plan "$root/recipes/tiny-demo.yaml" --model olmo3-7b --save-model-config "$dir/olmo7b/config.json" \
  >/dev/null 2>&1
out=$("$bin" train "$root/recipes/tiny-demo.yaml" model.init="$dir/olmo7b" tokenizer=builtin:bytes \
  data.path="$dir/data" global_batch=1 per_device_batch=1 steps=1 output_dir="$dir/runs" 2>&1); rc=$?
check "train refuses the 7B on this CPU with exit 2" "[ $rc -eq 2 ]"
check "... with the plan's message, before reading weights" \
  "grep -q 'DOES NOT FIT' <<<\"\$out\" && ! grep -qi 'safetensors' <<<\"\$out\""
check "... and creates no run directory" "[ ! -e '$dir/runs' ]"

finish plan_cli
