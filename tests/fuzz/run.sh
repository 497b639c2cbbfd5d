#!/usr/bin/env bash
# `make fuzz`: mutates each libFuzzer target for FUZZ_SECONDS (default 60) starting from its seed corpus
# (tests/fuzz/corpus_<name>, never written to: new inputs go to BUILD/fuzz/work_<name>). Exits non-zero on the
# first target with a finding (crash, sanitizer report, uncaught exception other than olmosft::Error, a run
# over FUZZ_TIMEOUT seconds, or memory over FUZZ_RSS_MB); the reproducer is in BUILD/fuzz/artifacts_<name>/.
# Usage: tests/fuzz/run.sh BUILD [TARGET...]   (default: every target; FUZZ_JOBS targets run at a time)
set -uo pipefail
build=${1:?usage: run.sh BUILD [TARGET...]}
shift
root=$(cd "$(dirname "$0")/../.." && pwd)
targets=("$@")
((${#targets[@]})) || targets=(safetensors template tokenizer recipe manifest pickle)
seconds=${FUZZ_SECONDS:-60} timeout=${FUZZ_TIMEOUT:-10} rss=${FUZZ_RSS_MB:-2048} jobs=${FUZZ_JOBS:-1}
cmake --build "$build" --target fuzz || exit 1
one() {
  local name=$1 bin="$build/fuzz/fuzz_$1" work="$build/fuzz/work_$1" art="$build/fuzz/artifacts_$1"
  mkdir -p "$work" "$art"
  local dict=()
  case $name in tokenizer | manifest) dict=(-dict="$root/tests/fuzz/json.dict") ;; template | recipe) dict=(-dict="$root/tests/fuzz/$name.dict") ;; esac
  "$bin" "${dict[@]}" -max_total_time="$seconds" -timeout="$timeout" -rss_limit_mb="$rss" -malloc_limit_mb="$rss" \
    -print_final_stats=1 -artifact_prefix="$art/" "$work" "$root/tests/fuzz/corpus_$name" \
    >"$build/fuzz/log_$name.txt" 2>&1
  local rc=$?
  local runs corp
  runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$build/fuzz/log_$name.txt" | grep -o '[0-9]*$')
  corp=$(find "$work" -type f | wc -l)
  if ((rc == 0)); then
    echo "fuzz_$name: ${seconds}s, ${runs:-?} executions, work corpus $corp inputs: no finding"
  else
    echo "fuzz_$name: FINDING (exit $rc), reproducer in $art/, log $build/fuzz/log_$name.txt:"
    grep -E 'ERROR|SUMMARY|terminate|what\(\)|runtime error|Test unit written' "$build/fuzz/log_$name.txt" | head -8
  fi
  return $rc
}
status=0
running=0
for t in "${targets[@]}"; do
  one "$t" &
  ((++running >= jobs)) && { wait -n || status=1; ((running--)); }
done
while ((running > 0)); do wait -n || status=1; ((running--)); done
exit $status
