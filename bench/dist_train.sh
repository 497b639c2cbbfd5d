#!/usr/bin/env bash
# Multi-process training through the trainer (`olmosft train` under mpirun): tokens/s for 1 and 2 processes
# (1 thread each, so 2 processes use the 2 cores that 1 process x 2 threads would) in data-parallel and
# ZeRO-3 mode, scaling efficiency = tok/s(2 processes) / (2 x tok/s(1 process)), the bytes each rank sent
# per step against the minimum of each mode, and per-rank persistent memory (params + grads + moments) and
# RSS. Model: the tiny Olmo 3 fixture widened to hidden 256 / intermediate 768 (~6.8M parameters).
# Usage: bench/dist_train.sh [build-dir]   (prints markdown; run by scripts/bench.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
build="${1:-build}"
bin="$build/olmosft"
if ! command -v mpirun >/dev/null 2>&1; then
  echo "dist_train: SKIP (mpirun not installed)"
  exit 0
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export OMPI_MCA_btl=self,vader OMPI_MCA_btl_vader_single_copy_mechanism=none OMP_NUM_THREADS=1
steps=${DIST_BENCH_STEPS:-6}
"$bin" data build --input tests/golden/data/convs.jsonl --tokenizer builtin:bytes --seq-len 256 --seed 7 --epochs 4 \
  --quiet --out "$tmp/data" >/dev/null 2>&1
/usr/bin/python3 - "$tmp" <<'PY'
import json, sys
c = json.load(open("tests/golden/model/olmo3_tiny/config.json"))
c.update(hidden_size=256, intermediate_size=768, head_dim=64)
json.dump(c, open(sys.argv[1] + "/config.json", "w"))
PY
common=(model.config="$tmp/config.json" tokenizer=builtin:bytes data.path="$tmp/data" data.epochs=4 seq_len=256
  global_batch=8 per_device_batch=4 steps="$steps" output_dir="$tmp/runs" export.hf=false eval.heldout=0
  log.tensorboard=false perf.peak_tflops=1 checkpoint.every=0)
# median tokens/s over steps 2.. (step 1 warms up) from metrics.jsonl
tps() { /usr/bin/python3 -c "
import json, statistics, sys
r = [json.loads(l) for l in open(sys.argv[1])][1:]
print('%.0f' % statistics.median(x['tokens_per_s'] for x in r))" "$tmp/runs/$1/metrics.jsonl"; }
run() {  # name np mode threads [key=value ...]
  local name=$1 np=$2 mode=$3 th=$4
  shift 4
  if [ "$np" = 0 ]; then
    "$bin" train recipes/tiny-demo.yaml "${common[@]}" run_name="$name" compute.threads="$th" dist.mode="$mode" "$@" \
      >"$tmp/$name.out" 2>&1
  else
    mpirun --oversubscribe --allow-run-as-root -np "$np" "$bin" train recipes/tiny-demo.yaml "${common[@]}" \
      run_name="$name" devices="$np" compute.threads="$th" dist.mode="$mode" "$@" >"$tmp/$name.out" 2>&1
  fi
}
field() { grep '^DIST' "$tmp/$1.out" | tr ' ' '\n' | sed -n "s/^$2=//p"; }

echo "# Multi-process training through the trainer (mpirun, shared-memory transport)"
echo
echo "$(getconf _NPROCESSORS_ONLN) CPUs, load average before: $(cut -d' ' -f1-3 /proc/loadavg); $steps steps of 8 rows x 256 tokens, 2 leaves of 4 rows"
echo
echo "| run | processes x threads | mode | tokens/s | vs 1 process x 1 thread | sent MB/step/rank | minimum MB | persistent MB/rank | RSS MB/rank |"
echo "|---|---|---|---|---|---|---|---|---|"
run single1 0 dp 1
base=$(tps single1)
for spec in "single2 0 dp 2" "np1dp 1 dp 1" "np2dp 2 dp 1" "np1z 1 zero3 1" "np2z 2 zero3 1" "np2zs 2 zero3 1"; do
  read -r name np mode th <<<"$spec"
  extra=()
  [ "$name" = np2zs ] && extra=(dist.gather=step)
  run "$name" "$np" "$mode" "$th" "${extra[@]}"
done
for spec in "single1 1 dp 1" "single2 1 dp 2" "np1dp 1 dp 1" "np2dp 2 dp 1" "np1z 1 zero3 1" "np2z 2 zero3 1" "np2zs 2 zero3 1"; do
  read -r name np mode th <<<"$spec"
  t=$(tps "$name")
  mb() { /usr/bin/python3 -c "import sys; print(','.join('%.2f' % (float(x) / 1e6) for x in sys.argv[1].split(',')))" "$1"; }
  echo "| $name | $np x $th | $mode$([ "$name" = np2zs ] && echo ' (gather=step)') | $t | $(/usr/bin/python3 -c "print('%.2f' % ($t / $base))") |" \
    "$(mb "$(field "$name" sent_bytes_per_step_per_rank)") | $(mb "$(field "$name" minimum_bytes)") |" \
    "$(mb "$(field "$name" persistent_bytes_per_rank)") | $(mb "$(field "$name" rss_bytes_per_rank)") |"
done
e_dp=$(/usr/bin/python3 -c "print('%.2f' % ($(tps np2dp) / (2 * $(tps np1dp))))")
e_z=$(/usr/bin/python3 -c "print('%.2f' % ($(tps np2z) / (2 * $(tps np1z))))")
echo
echo "Scaling efficiency 1 -> 2 processes (tok/s(2) / (2 x tok/s(1)), same run): dp $e_dp, zero3 $e_z."
echo "Minimum bytes per rank per step: dp all-reduce 2(N-1)/N x 4P; zero3 per layer (Olmo 3 dense): forward and"
echo "backward all-gathers of every block per leaf + one reduce-scatter = (N-1)/N x 4 x (leaves x (2P - P_embed - P_head) + P)"
echo "(one leaf per rank at N = 2 here: about 3(N-1)/N x 4P); zero3 dist.gather=step: 2(N-1)/N x 4P."
