#!/usr/bin/env bash
# `olmosft xla export` + tests/xla-accel's xla_step_run on XLA's CPU plugin (docs/xla.md "Running an exported
# step"): the Olmo 3 fixture's step exported with its weights and batch and the results of running it here
# (--expect) runs again from the files alone and matches (the same program and inputs on the same plugin:
# exactly); a changed expected gradient is caught, naming it; a missing data file is refused naming it; a
# random-weight export (a preset cut to 1 layer) runs and prints its timing; --expect with random weights
# is refused.
set -u
bin=$1
dir=$2
run=$(dirname "$bin")/xla_step_run
root="$(cd "$(dirname "$0")/../.." && pwd)"
G="$root/tests/golden"
rm -rf "$dir" && mkdir -p "$dir"
. "$(dirname "${BASH_SOURCE[0]}")/lib/check.sh"  # pass, fails, check, finish

"$bin" xla export --model "$G/model/olmo3_tiny" --batch-file "$G/model/olmo3_tiny/batch.safetensors" --batch 2 \
  --seq 128 --vocab-tile 128 --lm-z 1e-5 --expect --out "$dir/fixture" >"$dir/export.out" 2>"$dir/export.err"
rc=$?
cat "$dir/export.out"
check "export with --expect (exit 0; 91 parameters + 6 batch arguments, 94 results)" \
  "[ $rc -eq 0 ] && grep -q 'arguments=97 results=94' '$dir/export.out' && [ \$(grep -c '^result .* expect ' '$dir/fixture/manifest.txt') -eq 94 ]"
"$run" cpu "$dir/fixture" 1 >"$dir/run.out" 2>"$dir/run.err"; rc=$?
grep -E '^(XLA-STEP|RESULT)' "$dir/run.out"
check "the exported step runs from its files and matches its expected results" \
  "[ $rc -eq 0 ] && grep -q '^RESULT xla_step .* passed' '$dir/run.out' && grep -q '^XLA-STEP plugin=cpu platform=cpu ' '$dir/run.out'"
check "ce_sum is the fixture's (1103.35 over its 167 trained targets)" \
  "python3 -c \"import struct,sys; v=struct.unpack('f', open('$dir/fixture/data/expect.ce_sum.bin','rb').read())[0]; sys.exit(abs(v-1103.3496)>0.01)\""

cp -r "$dir/fixture" "$dir/bad"
python3 - "$dir/bad/data/expect.grad.model.layers.3.mlp.down_proj.weight.bin" <<'PY'
import struct, sys
p = sys.argv[1]
b = bytearray(open(p, "rb").read())
v = struct.unpack_from("f", b, 40)[0]
struct.pack_into("f", b, 40, v + 1.0)
open(p, "wb").write(bytes(b))
PY
"$run" cpu "$dir/bad" 1 >"$dir/bad.out" 2>&1; rc=$?
check "a changed expected gradient fails, naming the tensor (exit 1)" \
  "[ $rc -eq 1 ] && grep -q 'grad.model.layers.3.mlp.down_proj.weight' '$dir/bad.out' && grep -q '^RESULT xla_step .* FAILED' '$dir/bad.out'"
rm "$dir/bad/data/arg.tokens.bin"
"$run" cpu "$dir/bad" 1 >"$dir/missing.out" 2>&1; rc=$?
check "a missing argument file is refused naming it (exit 2)" "[ $rc -eq 2 ] && grep -q 'arg.tokens.bin' '$dir/missing.out'"

"$bin" xla export --config olmo3-tiny --layers 1 --seq 64 --batch 1 --out "$dir/random" >/dev/null 2>&1; rc1=$?
"$run" cpu "$dir/random" 2 0.2 >"$dir/random.out" 2>&1; rc2=$?
grep '^XLA-STEP' "$dir/random.out"
check "a random-weight export runs and prints tokens/s and MFU (no expected results)" \
  "[ $rc1 -eq 0 ] && [ $rc2 -eq 0 ] && grep -Eq '^XLA-STEP .* layers 1 .* tokens_per_s=[0-9.]+ tflops=[0-9.]+ mfu=0\\.[0-9]+' '$dir/random.out' && ! grep -q '^RESULT' '$dir/random.out'"
python3 - "$G/model/olmo3_tiny/batch.safetensors" "$dir/bad_batch.safetensors" <<'PY'
import json, struct, sys
b = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", b[:8])[0]
h = json.loads(b[8:8 + n])
start = 8 + n + h["input_ids"]["data_offsets"][0]
out = bytearray(b)
struct.pack_into("<i", out, start + 4 * 5, 999999)  # row 0, position 5: outside the 512-entry vocabulary
open(sys.argv[2], "wb").write(bytes(out))
PY
"$bin" xla export --model "$G/model/olmo3_tiny" --batch-file "$dir/bad_batch.safetensors" --batch 2 --seq 128 \
  --out "$dir/badbatch" >/dev/null 2>"$dir/badbatch.err"; rc=$?
check "a batch file with a token outside the vocabulary is refused naming the file, row and position (exit 2)" \
  "[ $rc -eq 2 ] && grep -q 'bad_batch.safetensors: olmo3: token id 999999 at row 0, position 5' '$dir/badbatch.err'"
"$bin" xla export --config olmo3-tiny --seq 64 --expect --out "$dir/refused" >/dev/null 2>"$dir/refused.err"; rc=$?
check "--expect with random weights is refused (exit 2)" "[ $rc -eq 2 ] && grep -q 'needs every argument from files' '$dir/refused.err'"
"$bin" xla export --config olmo3-tiny --layers 2 --seq 64 --bf16 --attention cudnn --out "$dir/cudnn" \
  >/dev/null 2>"$dir/cudnn.err"; rc=$?
check "--attention cudnn writes cuDNN's forward and backward custom call per layer and says so in the manifest" \
  "[ $rc -eq 0 ] && [ \$(grep -c 'call_target_name = \"__cudnn\$fmhaSoftmax\"' '$dir/cudnn/step.mlir') -eq 2 ] && [ \$(grep -c 'call_target_name = \"__cudnn\$fmhaSoftmaxBackward\"' '$dir/cudnn/step.mlir') -eq 2 ] && grep -q ' attention cudnn$' '$dir/cudnn/manifest.txt'"
"$bin" xla export --model "$G/model/olmo3_tiny" --batch-file "$G/model/olmo3_tiny/batch.safetensors" --batch 2 \
  --seq 128 --attention cudnn --out "$dir/cudnn_packed" >/dev/null 2>"$dir/cudnn_packed.err"; rc=$?
ints() { od -An -v -td4 "$1" | tr -s ' ' '\n' | grep -v '^$'; }
check "--attention cudnn takes the fixture's packed rows (several documents per row) in cuDNN's packed form: its lengths cover every document token, offsets in tokens from the batch's start" \
  "[ $rc -eq 0 ] && grep -q '^arg cudnn_seqlen s32 2,[0-9]* file ' '$dir/cudnn_packed/manifest.txt' && grep -q 'PADDING_CAUSAL' '$dir/cudnn_packed/step.mlir' && [ \$(ints '$dir/cudnn_packed/data/arg.cudnn_seqlen.bin' | awk '{s+=\$1} END {print s}') -eq \$(ints '$dir/cudnn_packed/data/arg.segments.bin' | awk '\$1>=0' | wc -l) ] && [ \$(ints '$dir/cudnn_packed/data/arg.cudnn_offsets.bin' | head -1) -eq 0 ]"
"$bin" xla export --config olmo3-tiny --layers 1 --seq 64 --docs-per-row 4 --bf16 --attention cudnn \
  --out "$dir/cudnn_docs" >/dev/null 2>"$dir/cudnn_docs.err"; rc=$?
check "--docs-per-row 4: generated rows of 4 documents, cuDNN's packed form with max_seg_per_batch 4, lengths 16" \
  "[ $rc -eq 0 ] && grep -q 'max_seg_per_batch\\\\22: 4' '$dir/cudnn_docs/step.mlir' && [ \"\$(ints '$dir/cudnn_docs/data/arg.cudnn_seqlen.bin' | sort -u)\" = 16 ] && [ \"\$(ints '$dir/cudnn_docs/data/arg.cudnn_offsets.bin' | tr '\\n' ' ')\" = '0 16 32 48 64 ' ]"
"$bin" xla export --config olmo3-tiny --seq 64 --attention flash --out "$dir/flash" >/dev/null 2>"$dir/flash.err"; rc=$?
check "--attention with an unknown value is refused (exit 2)" "[ $rc -eq 2 ] && grep -q \"expected blockwise or cudnn, got 'flash'\" '$dir/flash.err'"
finish
