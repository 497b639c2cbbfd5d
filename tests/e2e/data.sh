#!/usr/bin/env bash
# `olmosft data build` / `data inspect` from the command line, on the fixtures in tests/golden/data.
set -u
bin=$1
dir=$2
G="$(cd "$(dirname "$0")/../golden/data" && pwd)"
rm -rf "$dir" && mkdir -p "$dir"
. "$(dirname "${BASH_SOURCE[0]}")/lib/check.sh"  # pass, fails, check, finish

"$bin" data build --input "$G/convs.hyparquet.v2.snappy.parquet" --tokenizer builtin:bytes --seq-len 512 --seed 7 \
  --epochs 2 --revision test-rev --out "$dir/a" >"$dir/a.out" 2>"$dir/a.err"; rc=$?
check "build exits 0" "[ $rc -eq 0 ]"
check "build summary names rows" "grep -q 'rows of 512 tokens x 2 epoch' '$dir/a.out'"
check "progress lines are greppable" "grep -q '^progress data-build stage=encode conversations=' '$dir/a.err' && grep -q '^progress data-build stage=done' '$dir/a.err'"
check "manifest records the revision" "grep -q '\"dataset_revision\": \"test-rev\"' '$dir/a/manifest.json'"
"$bin" data build --input "$G/convs.jsonl" --tokenizer builtin:bytes --seq-len 512 --seed 7 --epochs 2 --quiet \
  --out "$dir/b/" >/dev/null 2>"$dir/b.err"; rc=$?
check "jsonl build (--out with a trailing slash) exits 0, --quiet prints nothing" "[ $rc -eq 0 ] && [ ! -s '$dir/b.err' ] && [ -f '$dir/b/manifest.json' ] && [ -z \"\$(ls -A '$dir' | grep building)\" ]"
check "jsonl and parquet rows identical" "cmp -s '$dir/a/epoch-00000.rows' '$dir/b/epoch-00000.rows' && cmp -s '$dir/a/epoch-00001.rows' '$dir/b/epoch-00001.rows'"
out=$("$bin" data inspect "$dir/a" --verify); rc=$?
check "inspect stats" "[ $rc -eq 0 ] && grep -q 'all rows of 2 epoch' <<<\"\$out\" && grep -q 'src_math' <<<\"\$out\" && grep -q 'length histogram' <<<\"\$out\""
out=$("$bin" data inspect "$dir/a" --row 0 --epoch 1 --tokenizer builtin:bytes); rc=$?
check "inspect row decodes with trained spans" "[ $rc -eq 0 ] && grep -q '<|im_start|>assistant' <<<\"\$out\" && grep -q '\[\[' <<<\"\$out\""
out=$("$bin" data inspect "$dir/a" --row 0); rc=$?
check "inspect row without tokenizer shows ids" "[ $rc -eq 0 ] && grep -q '^256 ' <<<\"\$out\""
err=$("$bin" data inspect "$dir/a" --row 99999 2>&1); rc=$?
check "inspect bad row exits 2" "[ $rc -eq 2 ] && grep -q 'out of range' <<<\"\$err\""
err=$("$bin" data build --input "$G/convs.jsonl" --tokenizer builtin:bytes --seq-len 512 --seed 7 --out "$dir/a" 2>&1); rc=$?
check "non-empty --out refused" "[ $rc -eq 2 ] && grep -q 'not empty' <<<\"\$err\""
err=$("$bin" data build --input "$G/bad-no-messages.parquet" --tokenizer builtin:bytes --seq-len 512 --seed 7 --out "$dir/c" 2>&1); rc=$?
check "missing messages column: exit 2, no output" "[ $rc -eq 2 ] && grep -q \"no 'messages' column\" <<<\"\$err\" && [ ! -e '$dir/c' ]"
err=$("$bin" data build --input "$G/convs.jsonl" --tokenizer /nonexistent/tok --seq-len 512 --seed 7 --out "$dir/d" 2>&1); rc=$?
check "unloadable tokenizer: exit 2" "[ $rc -eq 2 ] && [ ! -e '$dir/d' ]"
err=$("$bin" data build --input "$G/convs.jsonl" --tokenizer builtin:bytes --seq-len 512 --seed 7 --long chop --out "$dir/e" 2>&1); rc=$?
check "bad --long: exit 2" "[ $rc -eq 2 ]"
"$bin" data build --input "$G/convs.jsonl" --tokenizer builtin:bytes --seq-len 512 --seed 7 --quiet \
  --sql "SELECT * FROM input WHERE source_dataset <> 'src_chat'" --mix 'src_math=0.5' --out "$dir/f" >/dev/null 2>&1; rc=$?
check "--sql and --mix" "[ $rc -eq 0 ] && grep -q '\"conversations_per_epoch\": 20' '$dir/f/manifest.json'"
err=$(OLMOSFT_DUCKDB=/nonexistent/duckdb "$bin" data build --input "$G/convs.jsonl" --tokenizer builtin:bytes \
  --seq-len 512 --seed 7 --sql "SELECT * FROM input" --out "$dir/g" 2>&1); rc=$?
check "--sql without a DuckDB binary: exit 2, names OLMOSFT_DUCKDB, no output" "[ $rc -eq 2 ] && grep -q 'OLMOSFT_DUCKDB=/nonexistent/duckdb is not an executable' <<<\"\$err\" && [ ! -e '$dir/g' ]"
{ head -3 "$G/convs.jsonl"; echo '[1, 2]'; } >"$dir/notobj.jsonl"
err=$("$bin" data build --input "$dir/notobj.jsonl" --tokenizer builtin:bytes --seq-len 512 --seed 7 --out "$dir/h" 2>&1); rc=$?
check "a JSONL line that is not an object: exit 2, names file and line 4" "[ $rc -eq 2 ] && grep -q 'notobj.jsonl, line 4: expected a JSON object' <<<\"\$err\" && [ ! -e '$dir/h' ]"
# With --sql, a malformed JSONL line is reported like without it: file and the right line, not DuckDB's
# off-by-one line and our internal read_json SQL (issue #17).
{ head -3 "$G/convs.jsonl"; echo '{"messages": [bad'; } >"$dir/badline.jsonl"
err=$("$bin" data build --input "$dir/badline.jsonl" --tokenizer builtin:bytes --seq-len 512 --seed 7 --sql "SELECT * FROM input" --out "$dir/l" 2>&1); rc=$?
check "--sql over a malformed JSONL line: exit 2, names line 4, no internal SQL" "[ $rc -eq 2 ] && grep -q 'badline.jsonl, line 4: not valid JSON' <<<\"\$err\" && ! grep -q 'read_json' <<<\"\$err\" && [ ! -e '$dir/l' ]"
# A field nested a million deep (issue #17: SIGSEGV in the JSON reader) is refused, naming file and line.
{ head -2 "$G/convs.jsonl"; printf '{"messages":[{"role":"user","content":"hi","x":'
  head -c 1000000 /dev/zero | tr '\0' '['; head -c 1000000 /dev/zero | tr '\0' ']'
  echo '},{"role":"assistant","content":"y"}]}'; } >"$dir/deep.jsonl"
err=$("$bin" data build --input "$dir/deep.jsonl" --tokenizer builtin:bytes --seq-len 64 --seed 0 --out "$dir/i" 2>&1); rc=$?
check "a row nested 1,000,000 deep: exit 2, names file, line 3 and the limit, no output" "[ $rc -eq 2 ] && grep -q 'deep.jsonl, line 3: JSON nests deeper than 256 levels' <<<\"\$err\" && [ ! -e '$dir/i' ]"
# A killed build's temporary directory (no process holds its lock) is removed by the next build, with a
# line; while a build holds it, a second build for the same --out is refused (issue #17).
mkdir -p "$dir/.j.building-Ab12Cd" && head -c 3000000 /dev/zero >"$dir/.j.building-Ab12Cd/tokens.spill"
"$bin" data build --input "$G/convs.jsonl" --tokenizer builtin:bytes --seq-len 512 --seed 7 --out "$dir/j" >/dev/null 2>"$dir/j.err"; rc=$?
check "a leftover .j.building-* is removed with a line naming it and its size" "[ $rc -eq 0 ] && [ ! -e '$dir/.j.building-Ab12Cd' ] && grep -q '^data-build removed-leftover dir=.*/.j.building-Ab12Cd bytes=3000000' '$dir/j.err'"
mkdir -p "$dir/.k.building-Zz99Yy"
err=$(flock "$dir/.k.building-Zz99Yy" "$bin" data build --input "$G/convs.jsonl" --tokenizer builtin:bytes --seq-len 512 --seed 7 --out "$dir/k" 2>&1); rc=$?
check "a locked (live) .k.building-* refuses a second build: exit 2, kept" "[ $rc -eq 2 ] && grep -q 'another data build is writing' <<<\"\$err\" && [ -d '$dir/.k.building-Zz99Yy' ] && [ ! -e '$dir/k' ]"
finish
