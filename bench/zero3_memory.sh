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
# Peak RSS of each rank (ru_maxrss via /usr/bin/time -o FILE.<rank>), MB: prints "rank0 max-of-the-others".
run() {  # name binary np model-key=value global_batch steps
  local name=$1 bin=$2 np=$3 model=$4 gb=$5 steps=$6
  local rc=0
  mpirun --oversubscribe --allow-run-as-root -np "$np" bash -c \
    'exec /usr/bin/time -f "%M" -o "$0.$OMPI_COMM_WORLD_RANK" "$@"' "$tmp/$name.rss" "$bin" train \
    recipes/tiny-demo.yaml "${common[@]}" "$model" global_batch="$gb" steps="$steps" run_name="$name" \
    devices="$np" >"$tmp/$name.out" 2>"$tmp/$name.err" || rc=$?
  # exit 5: an end-of-run CHECK (a one-step run of a random model) failed; the memory figure stands
  if [ "$rc" != 0 ] && ! grep -q '^STEP-GUARD: reached step' "$tmp/$name.out"; then
    echo "run $name failed (exit $rc):" >&2
    tail "$tmp/$name.err" >&2
    exit 1
  fi
  local r0 others=""
  r0=$(tail -1 "$tmp/$name.rss.0")
  for ((k = 1; k < np; k++)); do others="$others $(tail -1 "$tmp/$name.rss.$k")"; done
  echo "$r0 $(echo "${others:- $r0}" | tr ' ' '\n' | sort -n | tail -1)" | awk '{printf "%.1f %.1f", $1 / 1024, $2 / 1024}'
}
echo "$(getconf _NPROCESSORS_ONLN) CPUs, $(awk '/MemTotal/ {printf "%.0f GiB", $2 / 1048576}' /proc/meminfo), load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
echo
echo "Peak RSS (MB) of rank 0 (it alone gathers the final weights for the end-of-run checks and the export)"
echo "and the largest of the other ranks; ratios: the other ranks against the 1-rank run of the same binary."
echo
echo "| model | parameters | binary | 1 rank | 2 ranks: rank 0 / rank 1 | 4 ranks: rank 0 / others | rank 1 of 2 vs 1 rank | others of 4 vs 1 rank |"
echo "|---|---|---|---|---|---|---|---|"
for spec in "tiny 362K model.init=tests/golden/model/olmo3_tiny 8 2" \
  "small 8.5M model.config=$tmp/small.json 8 2" "wide 54M model.config=$tmp/wide.json 4 1"; do
  read -r name params model gb steps <<<"$spec"
  bins=("after:$after")
  [ -n "$before" ] && bins=("before:$before" "${bins[@]}")
  for b in "${bins[@]}"; do
    label=${b%%:*} bin=${b#*:}
    read -r a1 _ <<<"$(run "$name-$label-1" "$bin" 1 "$model" "$gb" "$steps")"
    read -r a2 o2 <<<"$(run "$name-$label-2" "$bin" 2 "$model" "$gb" "$steps")"
    read -r a4 o4 <<<"$(run "$name-$label-4" "$bin" 4 "$model" "$gb" "$steps")"
    echo "| $name | $params | $label | $a1 | $a2 / $o2 | $a4 / $o4 | $(awk "BEGIN{printf \"%.2f\", $o2/$a1}") | $(awk "BEGIN{printf \"%.2f\", $o4/$a1}") |"
  done
done
