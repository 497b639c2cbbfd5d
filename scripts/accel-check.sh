#!/usr/bin/env bash
# The XLA accelerator check (docs/xla.md, issue #29): the one script to run on a lent accelerator machine.
# That machine has CMake, a C++ compiler and JAX's CUDA PJRT plugin (or libtpu), PyTorch, none of the CPU
# build's dependencies and no network. This builds the XLA runtime alone (tests/xla-accel: src/xla, the
# runtime / builder / AOT tests, bench/xla_matmul.cpp, xla_step_run), runs the tests on the accelerator's
# plugin (OLMOSFT_XLA_TEST_PLUGIN; checks only XLA's CPU plugin can answer say "skipped"), the bf16
# matmul-chain benchmark (8 x 8192^3; JAX reached 686-731 TFLOP/s on an H200), and then the model's own
# training step as exported here by `olmosft xla export` (deps/xla-steps, made by --stage):
#   fixture-f32   the Olmo 3 fixture's step with its weights and batch: the accelerator's results must match
#                 XLA's CPU plugin's within 1e-5 of each tensor's scale (RESULT xla_step ... passed)
#   hybrid-chunk16, hybrid-recurrent  the hybrid fixture's step (KDA + MoE, tests/golden/model/olmo3moe_tiny)
#                 with the chunked delta rule (chunks of 16; documents start inside chunks) and with the
#                 token-by-token recurrence, each against XLA's CPU plugin within 1e-5 (issue #45: "kernel
#                 rewrites need a device-vs-exact-scan check"; here the two forms agree within 2e-6,
#                 unit_kda_xla_test, so the device's chunked program is checked against the exact scan)
#   7b4-8k        an Olmo-3-7B-shaped 4-layer stack (d 4096, 32 heads, FFN 11,008, vocab 100,278), one row of
#                 8,192 tokens, bf16 GEMM operands: XLA-STEP tokens/s and MFU, and the PyTorch peer in the
#                 same run (bench/olmo3_step_torch.py: transformers' Olmo3 with SDPA, eager, bf16) on the same
#                 config and FLOP count (goal, issue #29: MFU >= 0.40 and >= 1.25x PyTorch's tokens/s)
#   7b4-64k       the same at 65,536 tokens (PyTorch with gradient checkpointing); may not fit
#   *-cudnn       the same two steps with cuDNN's fused attention (`--attention cudnn`: the custom calls
#                 __cudnn$fmhaSoftmax[Backward] in JAX's form; xla_cudnn_attention_test checks them against
#                 the blockwise attention on the GPU first). JAX reached 0.438 MFU at 8,192 with cuDNN, 0.206
#                 without: the goal of 0.40 needs this path.
#   7b4-8k-cudnn-packed  the 8,192-token step with 4 documents of 2,048 tokens per row (`--docs-per-row 4`):
#                 cuDNN's packed form (PADDING_CAUSAL with segment lengths and offsets), how SFT rows are
#                 packed; its FLOPs count the shorter documents' attention
# Each step also prints XLA-MEMORY: the program's compiled per-device total (what `olmosft plan --compile
# h100:...` reports here without a GPU) against the device allocator's measured peak (PJRT_Device_MemoryStats;
# issue #46: the compiled figure is what a plan trusts, so the device must confirm it).
#
#   here, once:  scripts/install-deps.sh && scripts/accel-check.sh --stage
#                (deps/xla/include: the PJRT C API header; deps/googletest; deps/xla-steps: the exports)
#   there:       device tool run `scripts/accel-check.sh`, carry ["deps/xla/include", "deps/googletest",
#                "deps/xla-steps"], timeout_s 540
#   or here:     scripts/accel-check.sh --plugin cpu   (the same build, tests and the fixture step on XLA's CPU
#                plugin; the 7B-shaped steps are skipped there)
# Env: BUILD (default build-accel), PLUGIN_PATH (the plugin .so; default: JAX's CUDA plugin found through
# python3), PEAK_TFLOPS (default 989, an H100/H200's dense bf16). The log and a summary go to $OUT when set
# (the device tool's output folder), else to the build folder. Exit 0 only when everything ran and passed.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
steps=deps/xla-steps

stage() {  # here, with the CPU build: googletest's source (the GPU image lacks it) and the exported steps
  local src=${OLMOSFT_GTEST_SOURCE:-/usr/src/googletest}
  [[ -f $src/CMakeLists.txt ]] || { echo "accel-check --stage: no GoogleTest source at $src"; return 1; }
  rm -rf deps/googletest && cp -r "$src" deps/googletest || return 1
  local bin=${OLMOSFT_BIN:-build/olmosft}
  [[ -x $bin ]] || { echo "accel-check --stage: $bin not built (make build)"; return 1; }
  rm -rf "$steps" && mkdir -p "$steps"
  local G=tests/golden/model/olmo3_tiny
  "$bin" xla export --model $G --batch-file $G/batch.safetensors --batch 2 --seq 128 --vocab-tile 128 \
    --lm-z 1e-5 --expect --out "$steps/fixture-f32" &&
    "$bin" xla export --model tests/golden/model/olmo3moe_tiny --batch-file tests/golden/model/olmo3moe_tiny/batch.safetensors \
      --batch 2 --seq 64 --vocab-tile 128 --lm-z 1e-5 --delta-chunk 16 --expect --out "$steps/hybrid-chunk16" &&
    "$bin" xla export --model tests/golden/model/olmo3moe_tiny --batch-file tests/golden/model/olmo3moe_tiny/batch.safetensors \
      --batch 2 --seq 64 --vocab-tile 128 --lm-z 1e-5 --delta-chunk 0 --expect --out "$steps/hybrid-recurrent" &&
    "$bin" xla export --config olmo3-7b --layers 4 --seq 8192 --bf16 --out "$steps/7b4-8k" &&
    "$bin" xla export --config olmo3-7b --layers 4 --seq 65536 --bf16 --out "$steps/7b4-64k" &&
    "$bin" xla export --config olmo3-7b --layers 4 --seq 8192 --bf16 --attention cudnn --out "$steps/7b4-8k-cudnn" &&
    "$bin" xla export --config olmo3-7b --layers 4 --seq 65536 --bf16 --attention cudnn \
      --out "$steps/7b4-64k-cudnn" &&
    "$bin" xla export --config olmo3-7b --layers 4 --seq 8192 --bf16 --attention cudnn --docs-per-row 4 \
      --out "$steps/7b4-8k-cudnn-packed" || return 1
  du -sh "$steps"
}
if [[ "${1:-}" == "--stage" ]]; then
  stage
  exit $?
fi
plugin=cuda
[[ "${1:-}" == "--plugin" ]] && plugin=${2:?--plugin needs cpu, cuda, tpu or a path}
build="${BUILD:-build-accel}"
mkdir -p "$build"
log="${OUT:-$build}/accel-check.log"
summary="${OUT:-$build}/accel-check-summary.txt"

find_cuda_plugin() {  # JAX's CUDA PJRT plugin (jax-cuda13-pjrt / jax-cuda12-pjrt), as installed in the image
  python3 - <<'PY' 2>/dev/null
import glob, importlib, os
for mod in ("jax_plugins.xla_cuda13", "jax_plugins.xla_cuda12"):
    try:
        m = importlib.import_module(mod)
    except Exception:
        continue
    for path in glob.glob(os.path.join(os.path.dirname(m.__file__), "*.so")):
        print(path)
        raise SystemExit
PY
}

check() {
  local status=0 path=""
  echo "== accel-check $(date -u +%FT%TZ), $(git rev-parse --short HEAD 2>/dev/null || echo 'no git'), $(nproc) CPUs"
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  case $plugin in
    cpu) path=$(ls deps/xla/cpu/xla_cpu_pjrt.so 2>/dev/null) ;;
    cuda) path=${PLUGIN_PATH:-$(find_cuda_plugin)} ;;
    *) path=${PLUGIN_PATH:-$plugin} ;;
  esac
  [[ -n "$path" && -f "$path" ]] || { echo "accel-check: no PJRT plugin found for '$plugin' (set PLUGIN_PATH)"; return 1; }
  echo "== plugin $plugin: $path"
  local gtest=()
  [[ -f deps/googletest/CMakeLists.txt ]] && gtest=("-DOLMOSFT_GTEST_SOURCE=$PWD/deps/googletest")
  echo "== configure + build (tests/xla-accel)"
  cmake -S tests/xla-accel -B "$build" -DCMAKE_BUILD_TYPE=Release "${gtest[@]}" >"$build/configure.log" 2>&1 &&
    cmake --build "$build" -j "$(nproc)" >"$build/build.log" 2>&1 ||
    { tail -n 30 "$build/configure.log" "$build/build.log"; echo "accel-check: build FAILED"; return 1; }
  # The tests load the plugin by name (cpu, or cuda / tpu through OLMOSFT_PJRT_CUDA / OLMOSFT_PJRT_TPU) or path.
  local name=$plugin
  case $plugin in
    cpu) name=$path ;;
    cuda) export OLMOSFT_PJRT_CUDA=$path ;;
    tpu) export OLMOSFT_PJRT_TPU=$path TPU_SKIP_MDS_QUERY=1 ;;
  esac
  for t in xla_runtime_test xla_hlo_builder_test xla_aot_test xla_cudnn_attention_test; do
    echo "== $t on $plugin"
    if OLMOSFT_XLA_TEST_PLUGIN=$name "$build/$t"; then echo "RESULT $t passed"; else echo "RESULT $t FAILED"; status=1; fi
  done
  echo "== bf16 matmul chain on $plugin"
  local n=8192 chain=8
  [[ $plugin == cpu ]] && n=512 chain=2
  "$build/bench_xla_matmul" "$name" "$n" "$chain" 10 "${PEAK_TFLOPS:-989}" || status=1
  run_steps "$name" || status=1
  return $status
}

# The exported training steps (deps/xla-steps, --stage) and the PyTorch peer on the big ones.
run_steps() {
  local name=$1 peak=${PEAK_TFLOPS:-989} d
  [[ -d $steps ]] || { echo "accel-check: no $steps (run scripts/accel-check.sh --stage here and carry it)"; return 1; }
  local status=0
  for d in "$steps"/fixture-f32 "$steps"/hybrid-chunk16 "$steps"/hybrid-recurrent "$steps"/7b4-8k "$steps"/7b4-8k-cudnn "$steps"/7b4-8k-cudnn-packed "$steps"/7b4-64k \
    "$steps"/7b4-64k-cudnn; do
    [[ -f $d/manifest.txt ]] || { echo "accel-check: $d missing"; status=1; continue; }
    if [[ $plugin == cpu && $d != *fixture* && $d != *hybrid* ]]; then echo "== $d: skipped on the CPU plugin (7B-shaped)"; continue; fi
    [[ $d == *cudnn* && $plugin != cuda ]] && { echo "== $d: skipped (cuDNN's attention: CUDA plugin only)"; continue; }
    echo "== training step $d on $plugin"
    "$build/xla_step_run" "$name" "$d" 3 "$peak" || { echo "RESULT xla_step $d FAILED (exit $?)"; status=1; }
    [[ $d == *fixture* || $d == *hybrid* || $d == *cudnn* ]] && continue  # the PyTorch peer once per shape
    local T B flops remat=()
    T=$(awk '/^model/ { for (i = 1; i < NF; i++) if ($i == "T") print $(i + 1) }' "$d/manifest.txt")
    B=$(awk '/^model/ { for (i = 1; i < NF; i++) if ($i == "B") print $(i + 1) }' "$d/manifest.txt")
    flops=$(awk '/^flops/ { print $2 }' "$d/manifest.txt")
    [[ $T -gt 8192 ]] && remat=(--remat)
    echo "== PyTorch peer (transformers Olmo3, SDPA, eager, bf16) on $d"
    timeout 300 python3 bench/olmo3_step_torch.py --config "$d/config.json" --batch "$B" --seq "$T" --dtype bf16 \
      --flops "$flops" --peak-tflops "$peak" "${remat[@]}" || echo "TORCH-STEP skipped: exit $?"
  done
  return $status
}

check 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
grep -E '^(RESULT|XLA-MATMUL|XLA-STEP|XLA-MEMORY|TORCH-STEP|==|accel-check)' "$log" >"$summary"
echo "accel-check: exit $rc; log $log, summary $summary"
exit "$rc"
