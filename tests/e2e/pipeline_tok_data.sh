#!/usr/bin/env bash
# Tokenizer + data build together: a dolma2 tokenizer dir made from the real dolma2 tokenizer.json, a packed dataset
# built with it from the JSONL and Parquet fixtures, and the runbook's EOS trap checked on the result (the
# final <|endoftext|> of every conversation is a trained target, <|im_end|> too mid-conversation).
set -u
bin=$1
work=$2
src=$(cd "$(dirname "$0")/../.." && pwd)
rm -rf "$work" && mkdir -p "$work"
. "$(dirname "${BASH_SOURCE[0]}")/lib/check.sh"  # pass, fails, check, finish

"$bin" tokenizer dolma2 --tokenizer-json "$src/deps/dolma2/allenai_dolma2.json" --out "$work/tok" >"$work/make.log" 2>&1
check "tokenizer dolma2 succeeds" "[ $? -eq 0 ]"
"$bin" check tokenizer "$work/tok" >"$work/check.log" 2>&1
check "check tokenizer passes" "[ $? -eq 0 ]"
for f in convs.jsonl convs.duckdb.zstd.parquet; do
  "$bin" data build --input "$src/tests/golden/data/$f" --tokenizer "$work/tok" --seq-len 512 --seed 3 \
    --out "$work/pk-$f" --quiet >"$work/build-$f.log" 2>&1
  check "data build from $f" "[ $? -eq 0 ]"
done
check "JSONL and Parquet give identical rows" "cmp -s '$work/pk-convs.jsonl/epoch-00000.rows' '$work/pk-convs.duckdb.zstd.parquet/epoch-00000.rows'"
"$bin" data inspect "$work/pk-convs.jsonl" --row 0 --tokenizer "$work/tok" >"$work/row0.txt" 2>&1
check "inspect shows a trained final EOS" "grep -q '<|endoftext|>]]' '$work/row0.txt'"
check "inspect shows a trained mid-conversation <|im_end|>" "grep -q '<|im_end|>]]' '$work/row0.txt'"
check "system and user turns are untrained" "! grep -q '\[\[<|im_start|>' '$work/row0.txt'"
"$bin" data build --input "$src/tests/golden/data/convs.jsonl" --tokenizer "$work/no-such-dir" --seq-len 512 \
  --seed 3 --out "$work/bad" >"$work/bad.log" 2>&1
rc=$?
check "a missing tokenizer dir is a clear error" "[ $rc -ne 0 ] && grep -q 'no-such-dir' '$work/bad.log' && [ ! -e '$work/bad/manifest.json' ]"
finish
