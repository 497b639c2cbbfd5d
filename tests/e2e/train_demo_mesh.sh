#!/usr/bin/env bash
# The demo recipe (recipes/tiny-demo.yaml: tiny Olmo 3 with the real 100,278-token dolma2 vocabulary, 8 rows
# of 256 tokens a step, gradient accumulation 2) trained through `olmosft train` on XLA's CPU plugin, on one
# device and on context-parallel meshes (docs/xla.md "The device mesh"): each row's tokens split over the
# context axis, alone (mesh.context=2, =4) and with the parameters split over fsdp x context
# (mesh.fsdp=2 mesh.context=2). The same batches reach every run (4 rows a micro-step: per_device_batch
# counts rows per device, so 4 / devices; the recipe's `devices: 1` becomes the mesh's), so every step's CE
# is within 1e-6 relative of the one-device run's and lm_z within one unit of its printed 6th decimal
# (~1e-3 of 0.0013): the mesh changes the order of the sums over devices (the CE's token sum, the gradient
# reductions; docs/numerics.md). Measured: at most 2 in CE's 6th decimal (1.8e-7 relative of 11.4), lm_z
# equal. A recipe whose explicit `devices` is not the mesh's is refused.
set -u
bin=$1
dir=$2
root="$(cd "$(dirname "$0")/../.." && pwd)"
rm -rf "$dir" && mkdir -p "$dir"
. "$(dirname "${BASH_SOURCE[0]}")/lib/check.sh"  # pass, fails, check, finish

# The demo's data (scripts/demo.sh steps 2-5), fewer chats: 400 comparison chats, the dolma2 tokenizer with
# the Olmo 3 think template, the tiny Olmo 3 config with the dolma2 vocabulary.
awk 'BEGIN { srand(7); for (i = 0; i < 400; i++) { a = int(rand() * 10); b = (a + 1 + int(rand() * 9)) % 10;
  printf "{\"id\": \"demo-%d\", \"messages\": [{\"role\": \"user\", \"content\": \"Which is larger, %d or %d?\"}, ", i, a, b;
  printf "{\"role\": \"assistant\", \"content\": \"<think>%d or %d</think>%d\"}]}\n", a, b, (a > b ? a : b) } }' \
  >"$dir/chats.jsonl"
"$bin" tokenizer dolma2 --tokenizer-json "$root/deps/dolma2/allenai_dolma2.json" --template think \
  --out "$dir/tokenizer" >"$dir/tok.out" 2>&1
rc=$?
check "the dolma2 tokenizer (deps/dolma2, scripts/install-deps.sh) is written" "[ $rc -eq 0 ]"
"$bin" data build --input "$dir/chats.jsonl" --tokenizer "$dir/tokenizer" --seq-len 256 --seed 0 --epochs 1 \
  --out "$dir/data" --quiet >"$dir/data.out" 2>&1
rc=$?
check "the demo's dataset builds" "[ $rc -eq 0 ]"
jq '.vocab_size = 100278 | .eos_token_id = 100257 | .pad_token_id = 100277' \
  "$root/tests/golden/model/olmo3_tiny/config.json" >"$dir/config.json"

run() {  # run NAME KEY=VALUE...: 3 steps of the demo recipe on XLA, stdout/stderr under $dir/NAME.*
  local name=$1
  shift
  "$bin" train "$root/recipes/tiny-demo.yaml" model.config="$dir/config.json" tokenizer="$dir/tokenizer" \
    data.path="$dir/data" output_dir="$dir/runs" run_name="$name" steps=3 lr_schedule_steps=100 \
    checkpoint.every=0 eval.heldout=0 log.tensorboard=false device=xla "$@" >"$dir/$name.out" 2>"$dir/$name.err"
}
# "step ce lm_z" per LOSS-PARTS line, as printed
parts() { sed -n 's/^LOSS-PARTS step=\([0-9]*\) ce=\([0-9.]*\) lm_z=\([0-9.]*\).*/\1 \2 \3/p' "$1"; }

run one devices=1 per_device_batch=4
rc=$?
check "the demo recipe trains 3 steps on one XLA device" "[ $rc -eq 0 ] && [ \$(parts '$dir/one.out' | wc -l) -eq 3 ]"
parts "$dir/one.out"
for m in "devices=2 mesh.context=2 per_device_batch=2" "devices=4 mesh.context=4 per_device_batch=1" \
  "devices=4 mesh.fsdp=2 mesh.context=2 per_device_batch=1"; do
  name=mesh_${m//[^a-z0-9]/_}
  # shellcheck disable=SC2086 # the keys are separate words
  run "$name" $m
  rc=$?
  devices=$(sed -n 's/^XLA plugin=cpu platform=cpu devices=\([0-9]*\) .*/\1/p' "$dir/$name.out" | head -1)
  paste <(parts "$dir/one.out") <(parts "$dir/$name.out") >"$dir/$name.txt"
  cat "$dir/$name.txt"
  check "demo recipe, $m: 3 steps, CE within 1e-6 and lm_z within 1.5e-6 of the one-device run's, $devices devices" \
    "[ $rc -eq 0 ] && [ '$devices' -gt 1 ] &&
     awk 'function r(a, b) { d = a - b; if (d < 0) d = -d; return d / b } function a(x) { return x < 0 ? -x : x }
          { n++; if (\$1 != \$4 || r(\$5, \$2) > 1e-6 || a(\$6 - \$3) > 1.5e-6) bad++; w = r(\$5, \$2) > w ? r(\$5, \$2) : w }
          END { printf \"largest CE gap %.3g relative\\n\", w; exit !(n == 3 && bad == 0) }' '$dir/$name.txt'"
done
# The recipe's own devices: 1 under a 2-device mesh: refused before any compute, naming the key.
run bad mesh.context=2 per_device_batch=2
rc=$?
check "devices: 1 under a 2-device mesh is refused (exit 2), naming devices and the mesh's count" \
  "[ $rc -eq 2 ] && grep -q 'devices=1 but the mesh (data=1 fsdp=1 expert=1 context=2) has 2 XLA devices' '$dir/bad.err'"
finish
