#!/usr/bin/env bash
# Measured peak RSS of one training step against `olmosft plan` (issue #16 item 5; bench/RESULTS.md "Memory
# plan"). For each model preset, sequence length, rank count and remat policy: the plan's per-rank peak
# (PLAN peak_bytes) and the largest VmHWM of the ranks (/usr/bin/time's maximum resident set size = VmHWM of
# /proc/<pid>/status) of `olmosft train` running one step of 1 row x T tokens per rank under dist.mode=zero3.
# Combinations whose plan x ranks exceeds MEASURE_LIMIT_GIB (all ranks share this machine) are skipped and
# listed. A policy the model cannot follow yet (the trainer refuses it) is reported as refused.
# Usage: scripts/plan-measure.sh [build-dir] > table.md
#   env: MODELS (olmo3-tiny olmo3-small olmo3moe-tiny olmo3moe-d2small), TS (4096 16384 65536), RANKS (1 2 4),
#        REMATS (none; add full once recomputation lands), MEASURE_LIMIT_GIB (12), CORES (nproc),
#        EXTRA (more key=value overrides for both plan and train, e.g. "compute.dtype=bf16")
# Not part of `make test` (minutes per row at T = 65,536).
set -euo pipefail
cd "$(dirname "$0")/.."
build="${1:-build}"
bin="$build/olmosft"
models=${MODELS:-"olmo3-tiny olmo3-small olmo3moe-tiny olmo3moe-d2small"}
ts=${TS:-"4096 16384 65536"}
ranks=${RANKS:-"1 2 4"}
remats=${REMATS:-none}
limit_gib=${MEASURE_LIMIT_GIB:-12}
cores=${CORES:-$(nproc)}
command -v mpirun >/dev/null || { echo "plan-measure: mpirun not installed" >&2; exit 1; }
[ -x /usr/bin/time ] || { echo "plan-measure: /usr/bin/time not installed" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export OMPI_MCA_btl=self,vader OMPI_MCA_btl_vader_single_copy_mechanism=none
# Chats of 100..800 words (about 800K byte tokens): rows of up to 65,536 tokens hold many documents.
/usr/bin/python3 - "$tmp/chats.jsonl" <<'PY'
import json, random, sys
random.seed(0)
w = "the a of to and in is it that for on with as was at by be this from or larger smaller number answer".split()
with open(sys.argv[1], "w") as f:
    for i in range(400):
        say = lambda: " ".join(random.choice(w) for _ in range(random.randint(50, 400)))
        f.write(json.dumps({"messages": [{"role": "user", "content": say()},
                                         {"role": "assistant", "content": say()}]}) + "\n")
PY
for T in $ts; do
  "$bin" data build --input "$tmp/chats.jsonl" --tokenizer builtin:bytes --seq-len "$T" --seed 1 --quiet \
    --out "$tmp/d$T" >/dev/null
done
echo "| model | T | ranks | remat | plan GiB/rank | measured GiB (max rank) | measured / plan |"
echo "|---|---|---|---|---|---|---|"
skipped=()
for m in $models; do
  for T in $ts; do
    for np in $ranks; do
      for remat in $remats; do
        th=$((cores / np))
        [ "$th" -ge 1 ] || th=1
        args=(recipes/tiny-demo.yaml model.config="$tmp/$m.json" tokenizer=builtin:bytes data.path="$tmp/d$T"
          seq_len="$T" global_batch="$np" per_device_batch=1 devices="$np" dist.mode=zero3 model.remat="$remat"
          steps=1 output_dir="$tmp/runs" run_name="r$m$T$np$remat" export.hf=false eval.heldout=0
          log.tensorboard=false checkpoint.every=0 perf.peak_tflops=1 compute.threads="$th" ${EXTRA:-})
        plan=$("$bin" plan "${args[@]}" --model "$m" --save-model-config "$tmp/$m.json" --device cpu-1000gib \
          | sed -n 's/^PLAN .*peak_bytes=\([0-9]*\).*/\1/p')
        total=$(/usr/bin/python3 -c "print(int($plan * $np / 2**30 > $limit_gib))")
        if [ "$total" = 1 ]; then
          skipped+=("$m T=$T ranks=$np remat=$remat (plan $(/usr/bin/python3 -c "print('%.1f' % ($plan*$np/2**30))") GiB in all)")
          continue
        fi
        # Each rank's /usr/bin/time writes its own file (on the shared stderr the ranks' lines interleaved).
        rm -f "$tmp"/rss.*
        if ! mpirun --oversubscribe --allow-run-as-root -np "$np" sh -c \
          '/usr/bin/time -f "MAXRSS %M" -o "$0.${OMPI_COMM_WORLD_RANK:-0}" "$@"' "$tmp/rss" "$bin" train \
          "${args[@]}" >"$tmp/out" 2>&1; then
          why=$(grep -m1 -E "not supported|DOES NOT FIT|rror" "$tmp/out" | cut -c1-120 || true)
          echo "| $m | $T | $np | $remat | $(/usr/bin/python3 -c "print('%.3f' % ($plan/2**30))") | refused: $why | |"
          continue
        fi
        kb=$(cat "$tmp"/rss.* 2>/dev/null | sed -n 's/^MAXRSS \([0-9]*\)$/\1/p' | sort -n | tail -1)
        if [ -z "$kb" ]; then
          echo "| $m | $T | $np | $remat | $(/usr/bin/python3 -c "print('%.3f' % ($plan/2**30))") | no MAXRSS line | |"
          tail -5 "$tmp/out" >&2
          continue
        fi
        /usr/bin/python3 -c "
p, k = $plan, $kb * 1024
print('| $m | $T | $np | $remat | %.3f | %.3f | %.3f |' % (p / 2**30, k / 2**30, k / p))"
      done
    done
  done
done
echo
echo "Machine: $(nproc) CPUs ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')), $(free -g | awk '/Mem:/{print $2}') GiB RAM; $(date -u +%Y-%m-%d)."
if [ "${#skipped[@]}" -gt 0 ]; then
  echo
  echo "Skipped (plan x ranks over MEASURE_LIMIT_GIB=$limit_gib GiB, the ranks share this machine):"
  for s in "${skipped[@]}"; do echo "- $s"; done
fi
