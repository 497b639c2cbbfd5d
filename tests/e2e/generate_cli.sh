#!/usr/bin/env bash
# `olmosft generate`: refusals with exit 2 and a message naming the file and line (bad JSON, bad messages,
# nothing to prompt with, empty file, missing file), bad options (no model, both --model and --config,
# --max-new-tokens 0), a prompt longer than max_position_embeddings; then a run on the tiny Olmo 3 fixture and
# on a random init (--config + --seed) that is deterministic for a given seed.
set -u
bin=$1
dir=$2
root="$(cd "$(dirname "$0")/../.." && pwd)"
M="$root/tests/golden/model/olmo3_tiny"
rm -rf "$dir" && mkdir -p "$dir"
. "$(dirname "${BASH_SOURCE[0]}")/lib/check.sh"  # pass, fails, check, finish
good='{"id": 1, "messages": [{"role": "user", "content": "hello"}]}'
printf '%s\n' "$good" >"$dir/good.jsonl"
gen() { "$bin" generate --model "$M" --tokenizer builtin:bytes --out "$dir/o.jsonl" "$@" 2>&1; }

printf '%s\n\n%s\n' "$good" '{"messages": [oops' >"$dir/badjson.jsonl"
err=$(gen --prompts "$dir/badjson.jsonl"); rc=$?
check "bad JSON: exit 2 naming file and line 3" "[ $rc -eq 2 ] && grep -q 'badjson.jsonl line 3: not valid JSON' <<<\"\$err\""
printf '%s\n%s\n' "$good" '{"messages": {"role": "user"}}' >"$dir/badmsgs.jsonl"
err=$(gen --prompts "$dir/badmsgs.jsonl"); rc=$?
check "messages not a list: exit 2, line 2" "[ $rc -eq 2 ] && grep -q 'badmsgs.jsonl line 2: messages is a JSON object' <<<\"\$err\""
printf '%s\n' '{"messages": [{"role": "user", "content": 5}]}' >"$dir/badcontent.jsonl"
err=$(gen --prompts "$dir/badcontent.jsonl"); rc=$?
check "non-string content: exit 2, line 1" "[ $rc -eq 2 ] && grep -q \"badcontent.jsonl line 1: message 0 has a 'content' of type number\" <<<\"\$err\""
printf '%s\n' '[1, 2]' >"$dir/notobj.jsonl"
err=$(gen --prompts "$dir/notobj.jsonl"); rc=$?
check "line not an object: exit 2" "[ $rc -eq 2 ] && grep -q 'notobj.jsonl line 1: expected a JSON object' <<<\"\$err\""
printf '%s\n' '{"msgs": []}' >"$dir/nokey.jsonl"
err=$(gen --prompts "$dir/nokey.jsonl"); rc=$?
check "no messages key: exit 2" "[ $rc -eq 2 ] && grep -q 'nokey.jsonl line 1: no \"messages\" key' <<<\"\$err\""
printf '%s\n' '{"messages": [{"role": "assistant", "content": "only"}]}' >"$dir/onlyasst.jsonl"
err=$(gen --prompts "$dir/onlyasst.jsonl"); rc=$?
check "only a trailing assistant message: exit 2" "[ $rc -eq 2 ] && grep -q 'onlyasst.jsonl line 1: no message left' <<<\"\$err\""
: >"$dir/empty.jsonl"
err=$(gen --prompts "$dir/empty.jsonl"); rc=$?
check "empty file: exit 2" "[ $rc -eq 2 ] && grep -q 'empty.jsonl: no prompts' <<<\"\$err\""
err=$(gen --prompts "$dir/missing.jsonl"); rc=$?
check "missing file: exit 2" "[ $rc -eq 2 ] && grep -q 'missing.jsonl does not exist' <<<\"\$err\""
long=$(head -c 600 /dev/zero | tr '\0' a)
printf '{"messages": [{"role": "user", "content": "%s"}]}\n' "$long" >"$dir/long.jsonl"
err=$(gen --prompts "$dir/long.jsonl"); rc=$?
check "prompt longer than max_position_embeddings: exit 2" "[ $rc -eq 2 ] && grep -q 'max_position_embeddings 512' <<<\"\$err\""
err=$(gen --prompts "$dir/good.jsonl" --max-new-tokens 0); rc=$?
check "--max-new-tokens 0: exit 2" "[ $rc -eq 2 ] && grep -q 'max-new-tokens must be >= 1' <<<\"\$err\""
err=$("$bin" generate --tokenizer builtin:bytes --prompts "$dir/good.jsonl" --out "$dir/o.jsonl" 2>&1); rc=$?
check "no model: exit 2" "[ $rc -eq 2 ] && grep -q 'give --model HF_DIR or --config' <<<\"\$err\""
err=$(gen --prompts "$dir/good.jsonl" --config "$M/config.json"); rc=$?
check "--model and --config together: refused" "[ $rc -ne 0 ] && grep -qi 'excludes' <<<\"\$err\""
err=$("$bin" generate --model "$M" --tokenizer builtin:nope --prompts "$dir/good.jsonl" --out "$dir/o.jsonl" 2>&1); rc=$?
check "unknown builtin tokenizer: exit 2" "[ $rc -eq 2 ] && grep -q 'unknown builtin' <<<\"\$err\""
[ -e "$dir/o.jsonl" ]; check "no output written by the refused runs" "[ $? -ne 0 ]"

printf '%s\n%s\n' "$good" '{"id": "x", "messages": [{"role": "user", "content": "a much longer prompt than the first"}]}' \
  >"$dir/two.jsonl"
out=$(gen --prompts "$dir/two.jsonl" --batch 2 --max-new-tokens 4); rc=$?
check "fixture run: exit 0, summary line" "[ $rc -eq 0 ] && grep -q '^generate: 2 prompts' <<<\"\$out\""
cp "$dir/o.jsonl" "$dir/batched.jsonl"
gen --prompts "$dir/two.jsonl" --batch 1 --max-new-tokens 4 >/dev/null
check "batch 2 and batch 1 give the same completions" "cmp -s '$dir/o.jsonl' '$dir/batched.jsonl'"
check "output fields" "jq -e -s 'length == 2 and .[0].id == 1 and .[1].id == \"x\" and .[0].line == 1 and all(.[]; (.tokens | length) <= 4 and (.completion | type) == \"string\" and (.stopped | type) == \"boolean\")' '$dir/o.jsonl' >/dev/null"
run_init() { "$bin" generate --config "$M/config.json" --seed "$1" --tokenizer builtin:bytes --prompts "$dir/two.jsonl" \
  --out "$dir/$2" --max-new-tokens 4 >/dev/null 2>&1; }
run_init 3 s3a.jsonl && run_init 3 s3b.jsonl && run_init 4 s4.jsonl; rc=$?
check "random init: same seed, same ids; another seed, other ids" \
  "[ $rc -eq 0 ] && cmp -s '$dir/s3a.jsonl' '$dir/s3b.jsonl' && ! cmp -s '$dir/s3a.jsonl' '$dir/s4.jsonl'"
finish
