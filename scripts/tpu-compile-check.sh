#!/usr/bin/env bash
# The TPU compile check (docs/xla.md "Ahead-of-time compile for a TPU topology"; issue #29 item 6): on this
# CPU-only machine, libtpu compiles Olmo 3's training step ahead of time for a TPU v4 slice (v4:2x2x1: 4 chips,
# one host), so the emitted StableHLO is known to be valid for the TPU compiler, and its per-chip memory known,
# before a TPU is allocated. Steps: `scripts/install-deps.sh --tpu` (libtpu 0.0.51 into deps/xla/tpu, sha256
# pinned in deps/pypi/files.txt), build olmosft if needed, then `olmosft xla compile` for
#   (a) the tiny Olmo 3 fixture (tests/golden/model/olmo3_tiny) at T 256 and 4,096, f32 and bf16;
#   (b) a 7B-shaped 4-layer Olmo 3 (Olmo-3-7B's shapes: d 4096, 32 heads, 32 KV heads x 128, FFN 11,008, vocab
#       100,278; layers sliding, sliding, sliding, full) at T 8,192, bf16, one row; and the same as one
#       data-parallel SPMD program over the 4 chips (--spmd 4, 4 rows, xla.devices), parameters replicated
#       and split (--shard-params, xla.shard_params); and with model.remat full (--remat full);
#   (c) the Olmo 3 7B recipe as written on v4:4x4x8 (128 chips) through `olmosft plan --compile`, which must
#       fit, in under 2 minutes.
# Each prints one `XLA-AOT ...` line (compile seconds, argument / output / temp / code bytes, the chip's HBM)
# and a human line; the XLA-AOT lines are collected in $OUT/tpu-compile-check.txt (default build/).
#
#   scripts/tpu-compile-check.sh [--topology v4:2x2x1] [--skip-install]
# Env: BUILD (default build), OLMOSFT (a built binary; default $BUILD/olmosft, built with ninja if missing).
# Exit status 0 only when every compile succeeded.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1

topology=v4:2x2x1
install=1
while (($#)); do
  case "$1" in
    --topology) topology=$2; shift 2 ;;
    --skip-install) install=0; shift ;;
    *) echo "tpu-compile-check: unknown option $1 (expected --topology T, --skip-install)" >&2; exit 2 ;;
  esac
done

build="${BUILD:-build}"
bin="${OLMOSFT:-$build/olmosft}"
out="${OUT:-$build}/tpu-compile-check.txt"
((install)) && { scripts/install-deps.sh --tpu || exit 1; }
if [[ ! -x "$bin" || ! -x "$build/xla_libtpu_test" ]]; then
  [[ -f "$build/build.ninja" ]] || cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release || exit 1
  ninja -C "$build" olmosft xla_libtpu_test || exit 1
fi

# libtpu without a TPU: skip the cloud metadata server (else over 10 minutes of retries), no lock file, logs
# in a temporary folder instead of /tmp/tpu_logs. Its warnings about TPU_ACCELERATOR_TYPE and worker
# hostnames are expected here.
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export TPU_SKIP_MDS_QUERY=1 ALLOW_MULTIPLE_LIBTPU_LOAD=1 TPU_LOG_DIR="$tmp/tpu_logs"
export OLMOSFT_PJRT_TPU="${OLMOSFT_PJRT_TPU:-$PWD/deps/xla/tpu/libtpu.so}"

status=0
: >"$out"
# The runtime's own check with libtpu (tests/xla-accel/xla_libtpu_test.cpp: topology, compile, statistics, an
# HBM overflow refused); not part of make test, since libtpu is an opt-in set-up.
echo "== xla_libtpu_test"
if "$build/xla_libtpu_test" >"$tmp/libtpu_test.out" 2>&1; then
  grep -E '^\[ *(OK|PASSED) *\]' "$tmp/libtpu_test.out"
else
  grep -E '^\[ *(FAILED|OK) *\]|Failure|Expected|actual|not installed' "$tmp/libtpu_test.out"
  echo "tpu-compile-check: xla_libtpu_test FAILED"
  status=1
fi
compile() {  # compile LABEL ARGS...: one `olmosft xla compile`, its lines kept, libtpu's chatter dropped
  local label=$1
  shift
  echo "== $label"
  if "$bin" xla compile --plugin tpu --topology "$topology" "$@" >"$tmp/stdout" 2>"$tmp/stderr"; then
    cat "$tmp/stdout"
    grep '^XLA-AOT' "$tmp/stdout" | sed "s/^/$label /" >>"$out"
  else
    cat "$tmp/stdout"
    grep -v -E 'TPU_ACCELERATOR_TYPE|TPU_WORKER_HOSTNAMES|worker hostname|Source Location|libtpu_init_utils|InitGoogle' \
      "$tmp/stderr" | tail -n 20
    echo "tpu-compile-check: $label FAILED"
    status=1
  fi
}

tiny=tests/golden/model/olmo3_tiny/config.json
compile tiny-T256 --config "$tiny" --seq 256
compile tiny-T4096 --config "$tiny" --seq 4096
compile tiny-T4096-bf16 --config "$tiny" --seq 4096 --bf16
# Olmo-3-7B's config (the olmo3-7b preset, docs/reference/architecture.md A.1) cut to its first 4 layers; the
# config.json compiled is written next to the results, so the shapes are on record.
compile 7b-shaped-4L-T8192-bf16 --config olmo3-7b --layers 4 --seq 8192 --bf16 \
  --save-model-config "$(dirname "$out")/olmo3-7b-4layers.config.json"
# The same 7B-shaped step as one data-parallel SPMD program over the slice's 4 chips (xla.devices 4, one row
# each): the partitioned program valid for the TPU compiler, its per-chip memory (parameters replicated).
compile 7b-shaped-4L-T8192-bf16-spmd4 --config olmo3-7b --layers 4 --seq 8192 --bf16 --batch 4 --spmd 4
# ... and with the parameters, gradients (and, in training, the moments) split over the 4 chips
# (xla.shard_params): what FSDP saves per chip.
compile 7b-shaped-4L-T8192-bf16-spmd4-sharded --config olmo3-7b --layers 4 --seq 8192 --bf16 --batch 4 --spmd 4 \
  --shard-params

# model.remat on TPU: the 7B-shaped step's temporaries without and with recomputation.
compile 7b-shaped-4L-T8192-bf16-remat-full --config olmo3-7b --layers 4 --seq 8192 --bf16 --remat full

# The Olmo 3 7B recipe as written (recipes/olmo3-7b-sft.yaml: 16 x 65,536 on v4:4x4x8's 128 chips, the runbook's
# mesh fsdp 16 x context 8, remat full, scanned layers, bf16), through `olmosft plan --compile`: it must print
# compiled=yes ... fits=yes (docs/plan.md "Compiled plans"), in under 2 minutes on 2 cores.
echo "== plan --compile tpu-v4:4x4x8 recipes/olmo3-7b-sft.yaml"
t0=$(date +%s)
if "$bin" plan --compile tpu-v4:4x4x8 recipes/olmo3-7b-sft.yaml >"$tmp/stdout" 2>"$tmp/stderr"; then
  grep -E '^PLAN compiled=|^compiled for' "$tmp/stdout"
  grep '^PLAN compiled=' "$tmp/stdout" | sed "s/^/olmo3-7b-recipe-v4-4x4x8 /" >>"$out"
  secs=$(($(date +%s) - t0))
  echo "plan --compile took ${secs} s"
  if ! grep -q '^PLAN compiled=yes .* fits=yes ' "$tmp/stdout" || ((secs > 120)); then
    echo "tpu-compile-check: the 7B recipe does not fit or took over 120 s"
    status=1
  fi
else
  tail -n 20 "$tmp/stdout"
  grep -v -E 'TPU_ACCELERATOR_TYPE|TPU_WORKER_HOSTNAMES|worker hostname|Source Location|libtpu_init_utils|InitGoogle' \
    "$tmp/stderr" | tail -n 20
  echo "tpu-compile-check: plan --compile of the 7B recipe FAILED"
  status=1
fi

echo "== summary ($out)"
cat "$out"
((status)) && echo "tpu-compile-check: FAILED" || echo "tpu-compile-check: all compiled"
exit $status
