#!/usr/bin/env bash
# Issue #17's probes in one place, as an adversarial user would run them against the built olmosft: hostile,
# huge or malformed inputs, a concurrent run, an interrupted run, a changed recipe on resume. Each probe
# asserts the exit code, a fragment of the message, and that nothing outside the probe's intended output
# changed: a listing + SHA-256 of every file under the test directory (inputs, a sentinel directory, the
# parent of the runs directory) is taken before and after, with only the probe's own output path excluded.
# Most probes also have a focused test elsewhere (data.sh, model_forward.sh, train_trainer_test, recipe_test,
# k8s_*_test, model_config_test); this script runs them together on the CLI.
set -u
bin=$1
dir=$2
root="$(cd "$(dirname "$0")/../.." && pwd)"
G="$root/tests/golden"
rm -rf "$dir" && mkdir -p "$dir/in" "$dir/logs" "$dir/sentinel" "$dir/out"
echo "must not change" >"$dir/sentinel/keep.txt"
ok() { echo "ok: $1"; pass=$((pass + 1)); }
bad() { echo "FAIL: $1"; fails=$((fails + 1)); }
. "$(dirname "${BASH_SOURCE[0]}")/lib/check.sh"  # pass, fails, check, finish

# The state of everything under $dir except the logs and the given intended output (a path relative to $dir).
snap() {
  (cd "$dir" && find . \( -path ./logs -o -path "./$1" \) -prune -o -print0 | sort -z |
    while IFS= read -r -d '' f; do
      if [ -f "$f" ]; then printf '%s %s\n' "$(sha256sum <"$f" | cut -c1-64)" "$f"; else printf 'dir %s\n' "$f"; fi
    done) | sha256sum | cut -c1-64
}

# probe NAME RC FRAGMENT OUTPUT -- COMMAND...: runs COMMAND (stdout+stderr to logs/NAME.log); checks its exit
# code is RC, the log holds FRAGMENT (grep -F) and nothing under $dir but OUTPUT changed.
probe() {
  local name=$1 want=$2 frag=$3 outp=${4:-none}
  shift 5
  local before after rc log
  log="$dir/logs/$(tr -c 'A-Za-z0-9\n' '_' <<<"$name").log"
  before=$(snap "$outp")
  "$@" >"$log" 2>&1
  rc=$?
  after=$(snap "$outp")
  if [ "$rc" -ne "$want" ]; then
    bad "$name: exit $rc, expected $want"
    tail -c 400 "$log"
  elif ! grep -qF -- "$frag" "$log"; then
    bad "$name: message lacks '$frag'"
    tail -c 400 "$log"
  elif [ "$before" != "$after" ]; then
    bad "$name: something outside '$outp' changed"
  else
    ok "$name (exit $rc, '$frag')"
  fi
}

deep() { # $1 levels of [ ... ]
  head -c "$1" /dev/zero | tr '\0' '['
  head -c "$1" /dev/zero | tr '\0' ']'
}

# ---- inputs --------------------------------------------------------------------------------------------
head -8 "$G/data/convs.jsonl" >"$dir/in/convs.jsonl"
{
  printf '{"messages":[{"role":"user","content":"hi","x":'
  deep 1000000
  printf '},{"role":"assistant","content":"y"}]}\n'
} >"$dir/in/deep.jsonl"
deep 100000 >"$dir/in/deep_tokens.json"
{
  printf '{"id":1,"messages":[{"role":"user","content":"hi","x":'
  deep 100000
  printf '}]}\n'
} >"$dir/in/deep_prompts.jsonl"
: >"$dir/in/empty.jsonl"
{
  head -2 "$dir/in/convs.jsonl"
  echo '{"messages": [oops'
} >"$dir/in/badline.jsonl"
python3 -c "print('[[1, 2, ' + '9' * 1000000 + ']]')" >"$dir/in/huge_value.json"
model="$G/model/olmo3_tiny"
mkdir -p "$dir/in/nullcfg"
cp "$model"/* "$dir/in/nullcfg/"
python3 - "$dir/in/nullcfg/config.json" <<'PY'
import json, sys
p = sys.argv[1]
c = json.load(open(p))
c["sliding_window"] = None
json.dump(c, open(p, "w"))
PY

# ---- data build / forward / generate on deep JSON --------------------------------------------------------
probe "data build: a row nested 1,000,000 deep" 2 "deep.jsonl, line 1: JSON nests deeper than 256 levels" out/deep -- \
  "$bin" data build --input "$dir/in/deep.jsonl" --tokenizer builtin:bytes --seq-len 64 --seed 0 --out "$dir/out/deep"
check "data build: no output directory after the refusal" "[ ! -e '$dir/out/deep' ]"
probe "forward --tokens nested 100,000 deep" 2 "deep_tokens.json: JSON nests deeper than 256 levels" out/fwd.json -- \
  "$bin" forward --model "$model" --tokens "$dir/in/deep_tokens.json" --out "$dir/out/fwd.json"
probe "generate --prompts nested 100,000 deep" 2 "JSON nests deeper than 256 levels" out/gen.jsonl -- \
  "$bin" generate --model "$model" --tokenizer builtin:bytes --prompts "$dir/in/deep_prompts.jsonl" \
  --out "$dir/out/gen.jsonl"
probe "generate --seed -1 is refused (was 18446744073709551615)" 2 "--seed" out/gen_seed.jsonl -- \
  "$bin" generate --config "$model/config.json" --seed -1 --tokenizer builtin:bytes --prompts "$dir/in/convs.jsonl" \
  --out "$dir/out/gen_seed.jsonl"
probe "forward: a 1 MB value is cut in the error" 2 "bytes)" out/huge.json -- \
  "$bin" forward --model "$model" --tokens "$dir/in/huge_value.json" --out "$dir/out/huge.json"
check "forward: the error line stays short (< 1000 bytes)" "[ \$(wc -c <'$dir/logs/forward__a_1_MB_value_is_cut_in_the_error.log') -lt 1000 ]"

# ---- data build messages ---------------------------------------------------------------------------------
probe "data build: an empty input file says so" 2 "empty.jsonl" out/empty -- \
  "$bin" data build --input "$dir/in/empty.jsonl" --tokenizer builtin:bytes --seq-len 64 --seed 0 --out "$dir/out/empty"
check "data build: the empty file is not reported as a missing column" \
  "! grep -q \"no 'messages' column\" '$dir/logs/data_build__an_empty_input_file_says_so.log'"
probe "data build: a malformed JSONL line names line 3" 2 "badline.jsonl, line 3" out/badline -- \
  "$bin" data build --input "$dir/in/badline.jsonl" --tokenizer builtin:bytes --seq-len 64 --seed 0 --out "$dir/out/badline"
probe "data build: --seed -1 is refused" 2 "seed" out/seedneg -- \
  "$bin" data build --input "$dir/in/convs.jsonl" --tokenizer builtin:bytes --seq-len 512 --seed -1 --out "$dir/out/seedneg"

# ---- a long BPE run: one 1 MiB word through the real dolma2 tokenizer completes with progress lines ------
dolma2_json="$root/deps/dolma2/allenai_dolma2.json"
if [ -f "$dolma2_json" ]; then
  "$bin" tokenizer dolma2 --tokenizer-json "$dolma2_json" --out "$dir/in/dolma2" >/dev/null 2>&1
  python3 -c "
import json
print(json.dumps({'messages': [{'role': 'user', 'content': 'repeat'}, {'role': 'assistant', 'content': 'a' * (1 << 20)}]}))" \
    >"$dir/in/longrun.jsonl"
  t0=$(date +%s)
  probe "data build: a 1 MiB run of one character (BPE) completes" 0 "progress data-build stage=encode" out/longrun -- \
    "$bin" data build --input "$dir/in/longrun.jsonl" --tokenizer "$dir/in/dolma2" --seq-len 4096 --long truncate \
    --seed 0 --out "$dir/out/longrun"
  echo "   (took $(($(date +%s) - t0)) s; quadratic BPE took ~30 min)"
else
  check "the real dolma2 tokenizer.json is installed at $dolma2_json (scripts/install-deps.sh)" "false"
fi

# ---- data inspect ------------------------------------------------------------------------------------------
"$bin" data build --input "$G/data/convs.jsonl" --tokenizer builtin:bytes --seq-len 512 --seed 7 --epochs 8 --quiet \
  --out "$dir/in/data" >/dev/null 2>&1
probe "data inspect --row -1 is refused" 2 "row" "" -- "$bin" data inspect "$dir/in/data" --row -1
# A manifest whose statistics were edited by hand: inspect names the key instead of printing null.
cp -r "$dir/in/data" "$dir/in/data_edited"
jq 'del(.stats.length_histogram[0].max)' "$dir/in/data/manifest.json" >"$dir/in/data_edited/manifest.json"
probe "data inspect: a manifest without stats.length_histogram[0].max names it" 2 \
  "missing key 'stats.length_histogram[0].max'" "" -- "$bin" data inspect "$dir/in/data_edited"
jq '.stats.sources |= with_entries(.value.read = "many")' "$dir/in/data/manifest.json" \
  >"$dir/in/data_edited/manifest.json"
probe "data inspect: a manifest whose stats.sources.src_chat.read is a string names it" 2 \
  "'stats.sources.src_chat.read' must be an integer in [0, 9223372036854775807], got \"many\"" "" -- "$bin" data inspect "$dir/in/data_edited"

# ---- recipes -----------------------------------------------------------------------------------------------
cat >"$dir/in/recipe.yaml" <<YAML
run_name: hostile
output_dir: $dir/out/runs
model:
  init: $model
tokenizer: builtin:bytes
data:
  path: $dir/in/data
  epochs: 8
seq_len: 512
global_batch: 4
per_device_batch: 2
steps: 40
optimizer:
  lr: 1e-3
perf:
  peak_tflops: 1
eval:
  heldout: 0
export:
  hf: false
log:
  tensorboard: false
YAML
printf 'steps: 3\nseed: 1\nseed: 2\n' >"$dir/in/dup.yaml"
probe "recipe: a duplicate key names both lines" 2 "key 'seed' is given twice (lines 2 and 3)" "" -- \
  "$bin" recipe show "$dir/in/dup.yaml"
probe "train: run_name=../escaped is refused" 2 "must be one directory name under output_dir" out/runs -- \
  "$bin" train "$dir/in/recipe.yaml" run_name=../escaped
check "train: nothing escaped output_dir" "[ ! -e '$dir/out/escaped' ] && [ ! -e '$dir/escaped' ]"
probe "train: config.json with sliding_window null is refused" 2 "'sliding_window' is null" out/runs -- \
  "$bin" train "$dir/in/recipe.yaml" model.init="$dir/in/nullcfg"
probe "train: compute.dtype=fp16 is refused naming the key" 2 "compute.dtype: expected fp32 or bf16, got 'fp16'" \
  out/runs -- "$bin" train "$dir/in/recipe.yaml" compute.dtype=fp16
probe "train: compute.gemm=mkl is refused naming the key" 2 \
  "compute.gemm: expected auto, openblas or onednn, got 'mkl'" out/runs -- \
  "$bin" train "$dir/in/recipe.yaml" compute.gemm=mkl

# ---- k8s render --------------------------------------------------------------------------------------------
mkdir -p "$dir/out/k8s_full" && echo keep >"$dir/out/k8s_full/other.yaml"
probe "k8s render into a non-empty --out is refused" 2 "not empty" "" -- \
  "$bin" k8s render "$root/recipes/olmo35-small-sft.k8s.yaml" --out "$dir/out/k8s_full"
probe "k8s render of the shipped k8s recipe works" 0 "" out/k8s -- \
  "$bin" k8s render "$root/recipes/olmo35-small-sft.k8s.yaml" --out "$dir/out/k8s"
probe "k8s render refuses what train would refuse (no data.path)" 2 "data.path is required" out/k8s2 -- \
  "$bin" k8s render "$root/recipes/olmo35-small-sft.k8s.yaml" data.path= --out "$dir/out/k8s2"

# ---- train: a locked run directory, Ctrl-C, resume with a changed recipe -----------------------------------
"$bin" train "$dir/in/recipe.yaml" >"$dir/logs/first.out" 2>&1 &
pid=$!
for _ in $(seq 1 1200); do grep -q '^LOSS-PARTS step=2 ' "$dir/logs/first.out" 2>/dev/null && break; sleep 0.05; done
probe "train: a second run on a locked run directory is refused naming the holder" 2 "pid $pid" out/runs -- \
  "$bin" train "$dir/in/recipe.yaml"
kill -INT "$pid"
wait "$pid"
rc=$?
check "train: SIGINT (Ctrl-C) exits 130 after a checkpoint" \
  "[ $rc -eq 130 ] && grep -q 'PREEMPTED: SIGINT; checkpoint of step' '$dir/logs/first.out' && ls -d '$dir/out/runs/hostile/checkpoints/step-'* >/dev/null 2>&1"
probe "train: resume with a changed recipe names the key" 2 "optimizer.lr" out/runs -- \
  "$bin" train "$dir/in/recipe.yaml" optimizer.lr=2e-3
check "train: the refusal says how to override" \
  "grep -q 'checkpoint.allow_recipe_change=true' '$dir/logs/train__resume_with_a_changed_recipe_names_the_key.log'"
kill "$pid" 2>/dev/null
wait "$pid" 2>/dev/null

check "the sentinel directory is unchanged" "[ \"\$(cat '$dir/sentinel/keep.txt')\" = 'must not change' ] && [ \$(ls -A '$dir/sentinel' | wc -l) -eq 1 ]"
finish
