#!/usr/bin/env bash
# `olmosft forward` on the Olmo 3 tiny fixture (tests/golden/model/olmo3_tiny): the mean CE over the fixture's
# trained targets must equal the PyTorch float64 value in expected.json within 1e-5 (the float32-vs-float64
# gap measured by the reference is 1.4e-7), per-position log-probs within 5e-5; JSON and .npy inputs give
# the same answer; bad inputs fail with exit code 2 and a message naming the file and the position.
set -u
bin=$1
tmp=$2
rm -rf "$tmp" && mkdir -p "$tmp"
here=$(cd "$(dirname "$0")/../.." && pwd)
model=$here/tests/golden/model/olmo3_tiny
in=$here/tests/golden/model/olmo3_tiny_forward
. "$(dirname "${BASH_SOURCE[0]}")/lib/check.sh"  # pass, fails, check, finish
near() { awk -v a="$1" -v b="$2" -v tol="$3" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= tol) }'; }

ref_ce=$(jq .ce "$in/expected.json")
ref_n=$(jq .trained_targets "$in/expected.json")

# 1. JSON inputs with the fixture's label mask.
"$bin" forward --model "$model" --tokens "$in/tokens.json" --segments "$in/segments.json" \
  --trained "$in/trained.json" --out "$tmp/json.json" >"$tmp/out1" 2>&1
rc=$?
check "forward (JSON inputs) exits 0" "[ $rc -eq 0 ]"
ce=$(jq .mean_ce "$tmp/json.json")
n=$(jq .trained_targets "$tmp/json.json")
echo "mean CE $ce (reference $ref_ce), $n trained targets"
check "trained target count = $ref_n" "[ '$n' = '$ref_n' ]"
check "mean CE within 1e-5 of the PyTorch float64 value" "near '$ce' '$ref_ce' 1e-5"
nn=$(jq '[.logprobs[][] | select(. != null)] | length' "$tmp/json.json")
check "one log-prob per trained target" "[ '$nn' = '$ref_n' ]"
maxd=$(jq -s '[ ([.[0].logprobs[][]] | to_entries) as $a | ([.[1].logprobs[][]]) as $b
  | $a[] | select(.value != null or $b[.key] != null)
  | if (.value == null or $b[.key] == null) then 1e9 else ((.value - $b[.key]) | fabs) end ] | max' \
  "$tmp/json.json" "$in/expected.json")
echo "log-probs max |diff| vs reference: $maxd"
check "log-probs within 5e-5 of the reference, null at the same positions" "near '$maxd' 0 5e-5"

# 2. The same from .npy files (int64 tokens, int32 segments, uint8 mask).
"$bin" forward --model "$model" --tokens "$in/tokens_i64.npy" --segments "$in/segments_i32.npy" \
  --trained "$in/trained_u8.npy" --out "$tmp/npy.json" >"$tmp/out2" 2>&1
rc=$?
check "forward (.npy inputs) exits 0" "[ $rc -eq 0 ]"
check ".npy and JSON inputs give identical output" "[ \"\$(jq -c .logprobs '$tmp/npy.json')\" = \"\$(jq -c .logprobs '$tmp/json.json')\" ]"

# 3. Default targets: every next token within a document.
"$bin" forward --model "$model" --tokens "$in/tokens.json" --segments "$in/segments.json" --out "$tmp/all.json" \
  >"$tmp/out3" 2>&1
check "default: every next token of each document is a target" \
  "[ \"\$(jq .trained_targets '$tmp/all.json')\" = \"\$(jq .all_next_token_targets '$in/expected.json')\" ]"

# 4. Bad inputs.
echo '[[1, 2, 512, 3]]' >"$tmp/oov.json"
err=$("$bin" forward --model "$model" --tokens "$tmp/oov.json" --out "$tmp/x.json" 2>&1)
rc=$?
check "token id out of range exits 2" "[ $rc -eq 2 ]"
check "...and names the row, position and id" "grep -q 'row 0, position 2: token id 512 is outside' <<<\"\$err\""
echo '[[1, 2.5, 3]]' >"$tmp/float.json"
err=$("$bin" forward --model "$model" --tokens "$tmp/float.json" --out "$tmp/x.json" 2>&1)
check "non-integer token is rejected" "[ $? -eq 2 ] && grep -q 'position 1: expected an integer' <<<\"\$err\""
echo '[[1, 2, 3]]' >"$tmp/t3.json"
echo '[[0, 0]]' >"$tmp/s2.json"
err=$("$bin" forward --model "$model" --tokens "$tmp/t3.json" --segments "$tmp/s2.json" --out "$tmp/x.json" 2>&1)
check "segments of the wrong length are rejected" "[ $? -eq 2 ] && grep -q 'row 0 has 2 entries' <<<\"\$err\""
echo '[[0, 1, 0]]' >"$tmp/s3.json"
err=$("$bin" forward --model "$model" --tokens "$tmp/t3.json" --segments "$tmp/s3.json" --out "$tmp/x.json" 2>&1)
check "non-contiguous documents are rejected" "[ $? -eq 2 ] && grep -q 'contiguous' <<<\"\$err\""
printf 'not json' >"$tmp/bad.json"
err=$("$bin" forward --model "$model" --tokens "$tmp/bad.json" --out "$tmp/x.json" 2>&1)
check "invalid JSON is rejected naming the file" "[ $? -eq 2 ] && grep -q 'bad.json: not valid JSON' <<<\"\$err\""
{ head -c 100000 /dev/zero | tr '\0' '['; head -c 100000 /dev/zero | tr '\0' ']'; } >"$tmp/deep.json"
err=$("$bin" forward --model "$model" --tokens "$tmp/deep.json" --out "$tmp/x.json" 2>&1)
check "tokens nested 100,000 deep: exit 2 naming the file and the limit (was SIGSEGV)" "[ $? -eq 2 ] && grep -q 'deep.json: JSON nests deeper than 256 levels' <<<\"\$err\""
printf '\x93NUMPY\x01\x00\x10\x00{garbage' >"$tmp/bad.npy"
err=$("$bin" forward --model "$model" --tokens "$tmp/bad.npy" --out "$tmp/x.json" 2>&1)
check "a corrupt .npy is rejected naming the file" "[ $? -eq 2 ] && grep -q 'bad.npy' <<<\"\$err\""
err=$("$bin" forward --model "$tmp/nowhere" --tokens "$tmp/t3.json" --out "$tmp/x.json" 2>&1)
check "a missing model directory is rejected" "[ $? -eq 2 ] && grep -q 'nowhere' <<<\"\$err\""
check "no output file was left by the failures" "[ ! -e '$tmp/x.json' ]"

finish
