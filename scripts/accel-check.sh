#!/usr/bin/env bash
# The XLA accelerator check (docs/xla.md, issue #29): the one script to run on a lent accelerator machine.
# That machine has CMake, a C++ compiler and JAX's CUDA PJRT plugin (or libtpu), none of the CPU build's
# dependencies and no network. This builds the XLA runtime alone (tests/xla-accel: src/xla, the runtime and
# StableHLO builder tests, bench/xla_matmul.cpp), runs both test binaries on the accelerator's plugin
# (OLMOSFT_XLA_TEST_PLUGIN; checks that only XLA's CPU plugin can answer say "skipped") and then the bf16
# matmul-chain benchmark (8 x 8192^3, as the probe in xla_backend.md: JAX reached 686-731 TFLOP/s on an H200).
# Not yet here (issue #29): the model's training step on XLA, its parity tests and the 7B-shaped case; they
# need the model's units to emit themselves (the one-decoder issue).
#
#   here, once:  scripts/install-deps.sh          (deps/xla/include: the PJRT C API header)
#                scripts/gpu-check.sh --stage     (deps/googletest: GoogleTest's source, which the image lacks)
#   there:       device tool run `scripts/accel-check.sh`, carry ["deps/xla/include", "deps/googletest"],
#                timeout_s 480
#   or here:     scripts/accel-check.sh --plugin cpu   (the same build and tests on XLA's CPU plugin)
# Env: BUILD (default build-accel), PLUGIN_PATH (the plugin .so; default: JAX's CUDA plugin found through
# python3), PEAK_TFLOPS (default 989, an H100/H200's dense bf16). The log and a summary go to $OUT when set
# (the device tool's output folder), else to the build folder. Exit 0 only when everything ran and passed.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
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
  for t in xla_runtime_test xla_hlo_builder_test xla_aot_test; do
    echo "== $t on $plugin"
    if OLMOSFT_XLA_TEST_PLUGIN=$name "$build/$t"; then echo "RESULT $t passed"; else echo "RESULT $t FAILED"; status=1; fi
  done
  echo "== bf16 matmul chain on $plugin"
  local n=8192 chain=8
  [[ $plugin == cpu ]] && n=512 chain=2
  "$build/bench_xla_matmul" "$name" "$n" "$chain" 10 "${PEAK_TFLOPS:-989}" || status=1
  return $status
}

check 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
grep -E '^(RESULT|XLA-MATMUL|==|accel-check)' "$log" >"$summary"
echo "accel-check: exit $rc; log $log, summary $summary"
exit "$rc"
