#!/usr/bin/env bash
# Peak resident memory per rank (VmHWM = ru_maxrss, from /usr/bin/time %M on every rank) of a whole
# `olmosft train` run under mpirun -np 1, 2, 4 in ZeRO-3, for a `before` binary (every rank loads the whole
# model; full-size gradients during a step) and this build's (docs/dist.md: shard-only loading, per-unit
# reduce-scatter). Models: the tiny Olmo 3 fixture (362K parameters), olmo3-small-like (d 256, 8 layers,
# vocab 4096: 8.5M) and the 54M-parameter model of dist_memory_test (d 512, 12 layers, vocab 4096).
# 8 leaves of 1 row x 128 tokens per step (4 for the 54M model), 2 steps (1), 1 thread per rank.
# Usage: bench/zero3_memory.sh [build-dir] [before-binary]   (prints markdown)
set -euo pipefail
cd "$(dirname "$0")/.."
build="${1:-build}"
after="$build/olmosft"
before="${2:-}"
if ! command -v mpirun >/dev/null 2>&1; then
  echo "zero3_memory: SKIP (mpirun not installed)"
  exit 0
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export OMPI_MCA_btl=self,vader OMPI_MCA_btl_vader_single_copy_mechanism=none OMP_NUM_THREADS=1
export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
"$after" data build --input tests/golden/data/convs.jsonl --tokenizer builtin:bytes --seq-len 128 --seed 7 \
  --epochs 4 --quiet --out "$tmp/data" >/dev/null 2>&1
/usr/bin/python3 - "$tmp" <<'PY'
import json, sys
base = json.load(open("tests/golden/model/olmo3_tiny/config.json"))
def write(name, d, layers, heads, kv, inter, vocab):
    c = dict(base)
    c.update(hidden_size=d, num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv,
             head_dim=d // heads, intermediate_size=inter, vocab_size=vocab, eos_token_id=vocab - 2,
             pad_token_id=vocab - 1,
             layer_types=["full_attention" if l % 4 == 3 else "sliding_attention" for l in range(layers)])
    json.dump(c, open(sys.argv[1] + "/" + name + ".json", "w"))
write("small", 256, 8, 8, 4, 704, 4096)
write("wide", 512, 12, 8, 4, 2048, 4096)
PY
common=(tokenizer=builtin:bytes data.path="$tmp/data" data.epochs=4 seq_len=128 per_device_batch=1
  output_dir="$tmp/runs" export.hf=false eval.heldout=0 log.tensorboard=false perf.peak_tflops=1
  checkpoint.every=0 compute.threads=1 dist.mode=zero3)
# Largest ru_maxrss over the ranks, MB (and every rank's, for the log).
run() {  # name binary np model-key=value global_batch steps
  local name=$1 bin=$2 np=$3 model=$4 gb=$5 steps=$6
  local rc=0
  mpirun --oversubscribe --allow-run-as-root -np "$np" /usr/bin/time -f "maxrss_kb=%M" "$bin" train \
    recipes/tiny-demo.yaml "${common[@]}" "$model" global_batch="$gb" steps="$steps" run_name="$name" \
    devices="$np" >"$tmp/$name.out" 2>"$tmp/$name.err" || rc=$?
  # exit 5: an end-of-run CHECK (a one-step run of a random model) failed; the memory figure stands
  if [ "$rc" != 0 ] && ! grep -q '^STEP-GUARD: reached step' "$tmp/$name.out"; then
    echo "run $name failed (exit $rc):" >&2
    tail "$tmp/$name.err" >&2
    exit 1
  fi
  sed -n 's/^maxrss_kb=//p' "$tmp/$name.err" | sort -n | tail -1 | awk '{printf "%.1f", $1 / 1024}'
}
echo "$(getconf _NPROCESSORS_ONLN) CPUs, $(awk '/MemTotal/ {printf "%.0f GiB", $2 / 1048576}' /proc/meminfo), load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
echo
echo "| model | parameters | binary | peak RSS MB/rank, 1 rank | 2 ranks | 4 ranks | 2 / 1 | 4 / 1 |"
echo "|---|---|---|---|---|---|---|---|"
for spec in "tiny 362K model.init=tests/golden/model/olmo3_tiny 8 2" \
  "small 8.5M model.config=$tmp/small.json 8 2" "wide 54M model.config=$tmp/wide.json 4 1"; do
  read -r name params model gb steps <<<"$spec"
  bins=("after:$after")
  [ -n "$before" ] && bins=("before:$before" "${bins[@]}")
  for b in "${bins[@]}"; do
    label=${b%%:*} bin=${b#*:}
    r1=$(run "$name-$label-1" "$bin" 1 "$model" "$gb" "$steps")
    r2=$(run "$name-$label-2" "$bin" 2 "$model" "$gb" "$steps")
    r4=$(run "$name-$label-4" "$bin" 4 "$model" "$gb" "$steps")
    echo "| $name | $params | $label | $r1 | $r2 | $r4 | $(awk "BEGIN{printf \"%.2f\", $r2/$r1}") | $(awk "BEGIN{printf \"%.2f\", $r4/$r1}") |"
  done
done
