#!/usr/bin/env bash
# `olmosft train` with `device: xla` (docs/xla.md) on XLA's CPU plugin against the CPU backend, the same
# recipe (the tiny Olmo 3 fixture, 3 steps of 2 micro-batches): per-step CE and lm_z within 1e-5 relative
# (two fp32 implementations, docs/numerics.md "Two fp32 backends"; measured about 1e-7, close to the
# 6-decimal print); a run checkpointed on the CPU resumes on XLA (checkpoint.allow_recipe_change, since the
# backend changes rounding) and its step 3 matches the all-CPU run's, and a run whose state lived on the XLA
# device (DEVICE-STATE) checkpoints what resumes on the CPU alike; the export is written; zero3 and a
# missing plugin are refused with their reasons.
set -u
bin=$1
dir=$2
root="$(cd "$(dirname "$0")/../.." && pwd)"
G="$root/tests/golden"
rm -rf "$dir" && mkdir -p "$dir"
. "$(dirname "${BASH_SOURCE[0]}")/lib/check.sh"  # pass, fails, check, finish

"$bin" data build --input "$G/data/convs.jsonl" --tokenizer builtin:bytes --seq-len 256 --seed 7 --epochs 1 --quiet \
  --out "$dir/data" >/dev/null 2>&1; rc=$?
check "dataset builds" "[ $rc -eq 0 ]"
cat >"$dir/recipe.yaml" <<YAML
output_dir: $dir/runs
model:
  init: $G/model/olmo3_tiny
tokenizer: builtin:bytes
data:
  path: $dir/data
seq_len: 256
global_batch: 4
per_device_batch: 2
steps: 3
optimizer:
  lr: 1e-3
loss:
  lm_z: 1e-4
perf:
  peak_tflops: 1
checkpoint:
  every: 1
  keep_last: 3
log:
  tensorboard: false
YAML
run() {  # run NAME KEY=VALUE...: trains, keeps stdout/stderr under $dir/NAME.*
  local name=$1
  shift
  "$bin" train "$dir/recipe.yaml" run_name="$name" "$@" >"$dir/$name.out" 2>"$dir/$name.err"
}
# "step ce lm_z" per LOSS-PARTS line
parts() { sed -n 's/^LOSS-PARTS step=\([0-9]*\) ce=\([0-9.]*\) lm_z=\([0-9.]*\).*/\1 \2 \3/p' "$1"; }
run cpu device=cpu; rc=$?
check "CPU backend trains (exit 0)" "[ $rc -eq 0 ]"
run xla device=xla; rc=$?
check "XLA backend trains (exit 0)" "[ $rc -eq 0 ] && [ -f '$dir/runs/xla/hf/config.json' ]"
grep '^XLA ' "$dir/xla.out"
# 3 steps x 2 micro-batches of one shape: one program compiled, 6 executions (+ the end-of-run checks' forwards)
check "XLA lines: the CPU plugin at start, one backward program compiled and run 6 times by the end" \
  "grep -q '^XLA plugin=cpu platform=cpu devices=1 compiles=0 ' '$dir/xla.out' && tail -1 <(grep '^XLA ' '$dir/xla.out') | grep -Eq ' compiles=[1-9][0-9]* compile_s=[0-9.e+-]+ executions=([6-9]|[1-9][0-9]+)$'"
check "the CPU run prints no XLA line" "! grep -q '^XLA ' '$dir/cpu.out'"
check "one XLA-PROGRAM line per compiled program: the step (B=2 T=256, its memory), the norm and the update" \
  "grep -Eq '^XLA-PROGRAM kind=step B=2 T=256 devices=1 compile_s=[0-9.e+-]+ argument_bytes=[1-9][0-9]* .* total_bytes=[1-9][0-9]*$' '$dir/xla.out' &&
   [ \$(grep -c '^XLA-PROGRAM kind=norm B=0 T=0 ' '$dir/xla.out') -eq 1 ] && [ \$(grep -c '^XLA-PROGRAM kind=update ' '$dir/xla.out') -eq 1 ] &&
   ! grep -q '^XLA-PROGRAM' '$dir/cpu.out'"
paste <(parts "$dir/cpu.out") <(parts "$dir/xla.out") >"$dir/both.txt"
cat "$dir/both.txt"
check "3 steps on each backend, CE and lm_z within 1e-5 relative" \
  "awk 'function r(a, b) { d = a - b; if (d < 0) d = -d; return d / b }
        { n++; if (\$1 != \$4 || r(\$5, \$2) > 1e-5 || r(\$6, \$3) > 1e-5) bad++; w = r(\$5, \$2) > w ? r(\$5, \$2) : w }
        END { printf \"largest CE gap %.3g over %d steps\\n\", w, n; exit !(n == 3 && bad == 0) }' '$dir/both.txt'"

# xla.devices 2: one SPMD program over the CPU plugin's two devices, each micro-batch's 2 rows one per device
# (per_device_batch counts rows per XLA device; devices defaults to 2): the same batches as the 1-device run,
# CE and lm_z within 1e-5 relative (a different summation order; measured: equal to the printed decimals).
run xla2 device=xla xla.devices=2 per_device_batch=1; rc=$?
paste <(parts "$dir/xla.out") <(parts "$dir/xla2.out") >"$dir/two.txt"
check "xla.devices 2: 3 steps within 1e-5 of one device, the state on the devices, the XLA line says devices=2" \
  "[ $rc -eq 0 ] && grep -q '^XLA plugin=cpu platform=cpu devices=2 ' '$dir/xla2.out' && grep -q '^DEVICE-STATE ' '$dir/xla2.out' &&
   awk 'function r(a, b) { d = a - b; if (d < 0) d = -d; return d / b }
        { n++; if (\$1 != \$4 || r(\$5, \$2) > 1e-5 || r(\$6, \$3) > 1e-5) bad++ } END { exit !(n == 3 && bad == 0) }' '$dir/two.txt'"
cat "$dir/two.txt"
# ... and with the parameters, gradient sums and moments split over the two devices (xla.shard_params).
run xla2s device=xla xla.devices=2 xla.shard_params=true per_device_batch=1; rc=$?
paste <(parts "$dir/xla.out") <(parts "$dir/xla2s.out") >"$dir/two_sharded.txt"
check "xla.devices 2 with xla.shard_params: 3 steps within 1e-5 of one device" \
  "[ $rc -eq 0 ] && awk 'function r(a, b) { d = a - b; if (d < 0) d = -d; return d / b }
        { n++; if (\$1 != \$4 || r(\$5, \$2) > 1e-5 || r(\$6, \$3) > 1e-5) bad++ } END { exit !(n == 3 && bad == 0) }' '$dir/two_sharded.txt'"
cat "$dir/two_sharded.txt"

# Context parallelism through the recipe's mesh: each row's 256 tokens split over mesh.context devices
# (per_device_batch 0.5: half a row per device; devices defaults to the mesh's), alone and with fsdp (the
# parameters split over fsdp x context): the same batches as the 1-device run, CE and lm_z within 1e-6
# relative (measured: equal to its 6 printed decimals but for one step of each, 1 in the 6th decimal).
for m in "mesh.context=4" "mesh.fsdp=2 mesh.context=2"; do
  name=cp_${m//[^a-z0-9]/_}
  # shellcheck disable=SC2086 # the mesh keys are separate words
  run "$name" device=xla $m per_device_batch=0.5; rc=$?
  paste <(parts "$dir/xla.out") <(parts "$dir/$name.out") >"$dir/$name.txt"
  cat "$dir/$name.txt"
  check "$m (context parallel): 3 steps, CE and lm_z within 1e-6 of one device's, 4 devices" \
    "[ $rc -eq 0 ] && grep -q '^XLA plugin=cpu platform=cpu devices=4 ' '$dir/$name.out' && grep -q '^DEVICE-STATE ' '$dir/$name.out' &&
     awk 'function r(a, b) { d = a - b; if (d < 0) d = -d; return d / b }
          { n++; if (\$1 != \$4 || r(\$5, \$2) > 1e-6 || r(\$6, \$3) > 1e-5) bad++ } END { exit !(n == 3 && bad == 0) }' '$dir/$name.txt'"
done
# model.remat=full on XLA (each block's forward re-emitted in the backward): the same losses as without.
run remat device=xla model.remat=full; rc=$?
paste <(parts "$dir/xla.out") <(parts "$dir/remat.out") >"$dir/remat.txt"
check "model.remat=full on XLA: 3 steps, CE and lm_z equal to the run without recomputation" \
  "[ $rc -eq 0 ] && awk '{ n++; if (\$1 != \$4 || \$2 != \$5 || \$3 != \$6) bad++ } END { exit !(n == 3 && bad == 0) }' '$dir/remat.txt'"
# The compiled figure decides (xla.memory_limit_gib, else the device's own limit): a program larger than the
# limit is refused after its compile, before it runs (here the first, the start-of-run check's forward),
# naming its parts.
run toobig device=xla xla.memory_limit_gib=0.001; rc=$?
check "a program over xla.memory_limit_gib is refused after its compile, before step 1 (exit 2)" \
  "[ $rc -eq 2 ] && grep -q '^XLA-PROGRAM kind=' '$dir/toobig.out' && ! grep -q '^LOSS-PARTS' '$dir/toobig.out' &&
   grep -Eq 'DOES NOT FIT \(compiled\): the (forward|step) program for [0-9]+ x 256 needs [0-9.]+ GiB per device \(arguments .* temporaries .* but the device allows 0.0010 GiB \(xla.memory_limit_gib\)' '$dir/toobig.err'"
run cpbad device=xla mesh.context=3 global_batch=3 per_device_batch=1; rc=$?
check "a mesh whose context axis does not divide seq_len is refused before any compute (exit 2)" \
  "[ $rc -eq 2 ] && grep -q 'seq_len 256 is not a multiple' '$dir/cpbad.err'"

# Resume across backends: 2 steps on the CPU, then step 3 on XLA from the CPU's step-2 checkpoint.
"$bin" train "$dir/recipe.yaml" run_name=mixed device=cpu steps=2 lr_schedule_steps=3 >"$dir/mixed1.out" 2>&1
rc1=$?
run mixed device=xla lr_schedule_steps=3 checkpoint.allow_recipe_change=true; rc2=$?
check "CPU for 2 steps, then resumed on XLA (exit 0, 0)" "[ $rc1 -eq 0 ] && [ $rc2 -eq 0 ] && grep -q 'step=2' '$dir/mixed1.out'"
cpu3=$(parts "$dir/cpu.out" | awk '$1 == 3 { print $2 }')
mix3=$(parts "$dir/mixed.out" | awk '$1 == 3 { print $2 }')
echo "step 3 CE: all CPU $cpu3, resumed on XLA $mix3"
check "the resumed run trained only step 3, on XLA, within 1e-5 of the all-CPU step 3" \
  "[ \"\$(parts '$dir/mixed.out' | wc -l)\" = 1 ] && [ -n '$mix3' ] && awk -v a='$mix3' -v b='$cpu3' 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d / b < 1e-5) }'"

# And back: 2 steps on XLA (the state on the device, downloaded into the checkpoint), step 3 on the CPU.
"$bin" train "$dir/recipe.yaml" run_name=back device=xla steps=2 lr_schedule_steps=3 >"$dir/back1.out" 2>&1
rc1=$?
run back device=cpu lr_schedule_steps=3 checkpoint.allow_recipe_change=true; rc2=$?
back3=$(parts "$dir/back.out" | awk '$1 == 3 { print $2 }')
echo "step 3 CE: all CPU $cpu3, XLA for steps 1-2 then the CPU $back3"
check "XLA kept the training state on the device (DEVICE-STATE line) and its checkpoint resumes on the CPU within 1e-5" \
  "[ $rc1 -eq 0 ] && [ $rc2 -eq 0 ] && grep -q '^DEVICE-STATE ' '$dir/back1.out' && ! grep -q '^DEVICE-STATE ' '$dir/back.out' && [ -n '$back3' ] && awk -v a='$back3' -v b='$cpu3' 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d / b < 1e-5) }'"

# The hybrid (Olmo 3.5 family: KDA, attention, latent MoE) on both backends, MoE losses on: step 1 (the same
# weights and batch) within 1e-5 relative for ce, moe_lb and router_z; steps 2-3 within 2e-3: XLA runs KDA's
# recurrent form, the CPU its chunked form (9.7e-5 apart in gradients, decoder_xla_test), and a top-k routing
# decision near a tie can flip after slightly different updates (measured: up to 1.7e-4 at step 2; AdamW turns
# a 1e-4 gradient difference on a near-zero element into a whole update).
hyb=(model.init="$G/model/olmo3moe_tiny" loss.moe_lb=0.01 loss.router_z=0.001 checkpoint.every=0)
run hcpu device=cpu "${hyb[@]}"; rc1=$?
run hxla device=xla "${hyb[@]}"; rc2=$?
hparts() { sed -n 's/^LOSS-PARTS step=\([0-9]*\) ce=\([0-9.]*\) lm_z=[0-9.]* moe_lb=\([0-9.]*\) router_z=\([0-9.]*\).*/\1 \2 \3 \4/p' "$1"; }
paste <(hparts "$dir/hcpu.out") <(hparts "$dir/hxla.out") | tee "$dir/hboth.txt"
check "the hybrid on both backends: step 1 within 1e-5, steps 2-3 within 2e-3 (ce, moe_lb, router_z)" \
  "[ $rc1 -eq 0 ] && [ $rc2 -eq 0 ] && awk 'function r(a, b) { d = a - b; if (d < 0) d = -d; return d / b }
        { n++; t = \$1 == 1 ? 1e-5 : 2e-3; if (r(\$6, \$2) > t || r(\$7, \$3) > t || r(\$8, \$4) > t) bad++ }
        END { exit !(n == 3 && bad == 0) }' '$dir/hboth.txt' && grep -q '^DEVICE-STATE ' '$dir/hxla.out'"

# Olmo Hybrid (Gated DeltaNet + attention, transformers' save_pretrained layout) on both backends: 3 steps,
# CE within 1e-5 relative (XLA's recurrent delta rule vs the CPU's chunked one; measured: equal to 5 of the 6
# printed decimals).
oh=(model.init="$G/model/hf_olmo_hybrid/rope_negeig" checkpoint.every=0)
run ocpu device=cpu "${oh[@]}"; rc1=$?
run oxla device=xla "${oh[@]}"; rc2=$?
paste <(parts "$dir/ocpu.out") <(parts "$dir/oxla.out") >"$dir/oboth.txt"
check "olmo_hybrid on both backends: 3 steps, CE within 1e-5 relative, the state on the device" \
  "[ $rc1 -eq 0 ] && [ $rc2 -eq 0 ] && awk '{ n++; d = \$2 - \$5; if (d < 0) d = -d; if (d / \$2 > 1e-5) bad++ }
        END { exit !(n == 3 && bad == 0) }' '$dir/oboth.txt' && grep -q '^DEVICE-STATE ' '$dir/oxla.out'"

run zero3 device=xla dist.mode=zero3; rc=$?
check "device xla with dist.mode zero3 is refused (exit 2, names the key)" \
  "[ $rc -eq 2 ] && grep -q 'device=xla needs dist.mode dp' '$dir/zero3.err'"
run noplugin device=xla xla.plugin=$dir/none.so; rc=$?
check "a missing plugin is refused naming its path" "[ $rc -ne 0 ] && grep -q '$dir/none.so' '$dir/noplugin.err'"
finish
