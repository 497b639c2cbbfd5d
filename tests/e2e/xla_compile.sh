#!/usr/bin/env bash
# `olmosft xla compile` (docs/xla.md "Ahead-of-time compile for a TPU topology") on XLA's CPU plugin, which
# cannot compile for a topology: without --topology the step is compiled by a client and its memory
# statistics printed (the XLA-AOT line: argument bytes = the parameters and batch arrays, exactly, for f32 on
# the CPU plugin's dense layouts); with one, the plugin's refusal names the PJRT call; bad flags exit 2 naming
# the flag. With libtpu installed (scripts/install-deps.sh --tpu) the tiny model is also compiled for
# v4:2x2x1 (scripts/tpu-compile-check.sh does the 7B-shaped one).
set -u
bin=$1
dir=$2
root="$(cd "$(dirname "$0")/../.." && pwd)"
tiny="$root/tests/golden/model/olmo3_tiny/config.json"
rm -rf "$dir" && mkdir -p "$dir"
. "$(dirname "${BASH_SOURCE[0]}")/lib/check.sh"  # pass, fails, check, finish
field() { sed -n "s/.* $1=\([^ ]*\).*/\1/p" <<<"$2"; }

out=$("$bin" xla compile --plugin cpu --config "$tiny" --seq 64 --batch 2 2>&1); rc=$?
line=$(grep '^XLA-AOT ' <<<"$out")
check "a client compile on the CPU plugin exits 0 with one XLA-AOT line" "[ $rc -eq 0 ] && [ -n \"\$line\" ]"
check "... naming plugin, platform, no topology, B and T" \
  "grep -q 'plugin=cpu platform=cpu topology=none devices=1 spmd=1 shard_params=0 mesh=data=1,fsdp=1,expert=1,context=1 layers=8 hidden=64 vocab=512 B=2 T=64 bf16=0 remat=none scan=0 backward=1' <<<\"\$line\""
# The tiny model's parameters (f32): embedding and LM head 512 x 64 each, per layer q, k, v, o (64x64, 32x64,
# 32x64, 64x64), q/k norms (64, 32), MLP 3 x 128 x 64 and two norms (64 each); the final norm (64). Plus the
# batch: tokens, seg, pos, targets, mask (s32, 128 each) and grad_scale (f32).
params=$((2 * 512 * 64 + 8 * (64 * 64 + 2 * 32 * 64 + 64 * 64 + 64 + 32 + 3 * 128 * 64 + 2 * 64) + 64))
check "argument_bytes is the parameters + the batch arrays exactly" \
  "[ \"$(field argument_bytes "$line")\" = $((4 * params + 5 * 4 * 128 + 4)) ]"
# 91 parameter tensors (2 + 8 x 11 + 1), so 94 results: a tuple, whose table of pointers the plugin counts.
check "output_bytes is the 3 loss scalars + one gradient per parameter (+ the result tuple's table)" \
  "[ \"$(field output_bytes "$line")\" = $((4 * params + 12 + 8 * 94)) ]"
tot=$(field total_bytes "$line")
sum=$(($(field argument_bytes "$line") + $(field output_bytes "$line") - $(field alias_bytes "$line") + \
  $(field temp_bytes "$line") + $(field generated_code_bytes "$line")))
check "total_bytes = arguments + outputs - alias + temp + code" "[ \"$tot\" = $sum ]"
check "a human line" "grep -q '^olmosft xla compile: olmo3 8 layers d 64 vocab 512, training step B=2 T=64 f32, for cpu (a client on this machine) (1 x device): compiled in .* s; per device .* MiB' <<<\"\$out\""

out=$("$bin" xla compile --plugin cpu --config olmo3-tiny --layers 2 --seq 32 --forward-only --bf16 \
  --save-model-config "$dir/c.json" 2>&1); rc=$?
check "a preset cut to 2 layers, forward only, bf16" \
  "[ $rc -eq 0 ] && grep -q 'layers=2 .* bf16=1 remat=none scan=0 backward=0' <<<\"\$out\""
check "... its config.json written with 2 layers and 2 layer types" \
  "python3 -c 'import json,sys; c=json.load(open(sys.argv[1])); sys.exit(not(c[\"num_hidden_layers\"]==2 and len(c[\"layer_types\"])==2))' '$dir/c.json'"

# --spmd 2: the same step as one data-parallel SPMD program over two CPU-plugin devices (xla.devices): the
# parameters replicated (each device's arguments hold all of them), the batch arrays split (half each).
out=$("$bin" xla compile --plugin cpu --config "$tiny" --batch 2 --seq 64 --spmd 2 2>&1); rc=$?
line=$(grep '^XLA-AOT ' <<<"$out")
check "--spmd 2: two devices, per device the parameters + half the batch arrays" \
  "[ $rc -eq 0 ] && grep -q 'devices=2 spmd=2 ' <<<\"\$line\" && [ \"$(field argument_bytes "$line")\" = $((4 * params + 5 * 4 * 64 + 4)) ]"
# --shard-params: the parameters split too (every first dimension of the fixture is even): half of them each.
out=$("$bin" xla compile --plugin cpu --config "$tiny" --batch 2 --seq 64 --spmd 2 --shard-params 2>&1); rc=$?
line=$(grep '^XLA-AOT ' <<<"$out")
check "--spmd 2 --shard-params: per device half the parameters + half the batch arrays" \
  "[ $rc -eq 0 ] && grep -q 'spmd=2 shard_params=1 ' <<<\"\$line\" && [ \"$(field argument_bytes "$line")\" = $((4 * params / 2 + 5 * 4 * 64 + 4)) ]"
out=$("$bin" xla compile --plugin cpu --config "$tiny" --batch 3 --seq 64 --spmd 2 2>&1); rc=$?
check "--spmd 2 with 3 rows exits 2 naming the mesh and the rows" "[ $rc -eq 2 ] && grep -q -- 'mesh data=2 .* splits each micro-batch.s rows evenly over data x fsdp = 2 devices; B=3 rows is not a multiple' <<<\"\$out\""
out=$("$bin" xla compile --plugin cpu --config "$tiny" --batch 2 --seq 64 --mesh context=2 --remat full --scan-layers 2>&1); rc=$?
check "--mesh context=2 --remat full --scan-layers: a context-parallel scanned step compiles, the line says so" \
  "[ $rc -eq 0 ] && grep -q 'devices=2 spmd=2 shard_params=1 mesh=data=1,fsdp=1,expert=1,context=2 .* remat=full scan=1 ' <<<\"\$out\""
out=$("$bin" xla compile --plugin cpu --config "$tiny" --seq 64 --mesh tensor=2 2>&1); rc=$?
check "--mesh with an unknown axis exits 2 naming the axes" "[ $rc -eq 2 ] && grep -q 'AXIS data, fsdp, expert or context' <<<\"\$out\""

out=$("$bin" xla compile --plugin cpu --topology v4:2x2x1 --config "$tiny" --seq 64 2>&1); rc=$?
check "a topology on the CPU plugin: exit 2 with the plugin's refusal and the call" \
  "[ $rc -eq 2 ] && grep -q 'PJRT_TopologyDescription_Create failed.*UNIMPLEMENTED' <<<\"\$out\""
out=$("$bin" xla compile --plugin cpu --config "$tiny" --seq 0 2>&1); rc=$?
check "--seq 0 exits 2 naming the flag" "[ $rc -eq 2 ] && grep -q -- '--seq must be >= 1, got 0' <<<\"\$out\""
out=$("$bin" xla compile --plugin cpu --config "$tiny" --seq 8 --layers 9 2>&1); rc=$?
check "--layers beyond the model exits 2" "[ $rc -eq 2 ] && grep -q -- '--layers 9: .* has 8 layers' <<<\"\$out\""
out=$("$bin" xla compile --plugin cpu --config olmo3-huge --seq 8 2>&1); rc=$?
check "an unknown preset exits 2 naming the presets" "[ $rc -eq 2 ] && grep -q \"unknown model preset 'olmo3-huge'\" <<<\"\$out\""
out=$("$bin" xla compile --plugin cpu --seq 8 2>&1); rc=$?
check "a missing --config exits 2" "[ $rc -eq 2 ] && grep -q -- '--config is required' <<<\"\$out\""
out=$("$bin" xla compile --plugin tpu --topology v5e:2x2 --config "$tiny" --seq 8 2>&1); rc=$?
check "an unsupported TPU topology exits 2 (before libtpu is loaded)" \
  "[ $rc -eq 2 ] && grep -q 'generation .v5e. is not supported' <<<\"\$out\""

libtpu="${OLMOSFT_PJRT_TPU:-$root/deps/xla/tpu/libtpu.so}"
if [ -f "$libtpu" ]; then
  out=$(TPU_LOG_DIR="$dir/tpu_logs" "$bin" xla compile --plugin tpu --config "$tiny" --seq 256 2>&1); rc=$?
  line=$(grep '^XLA-AOT ' <<<"$out")
  check "libtpu: the tiny step compiles for v4:2x2x1 (4 TPU v4 chips, 30.75 GiB each)" \
    "[ $rc -eq 0 ] && grep -q 'plugin=tpu platform=tpu topology=v4:2x2x1 devices=4 .* device_memory_bytes=33014413312' <<<\"\$line\""
  check "... with its memory statistics" "[ \"$(field argument_bytes "$line")\" -ge $((4 * params)) ]"
else
  echo "note: libtpu not installed ($libtpu): the TPU compile is not checked here"
fi

finish xla_compile
