#!/usr/bin/env bash
# The GPU check (docs/cuda.md): the one script to run on a lent GPU machine (H200). That machine is bare: it
# has nvcc, CMake, ninja and g++, none of the CPU build's dependencies, and no network. So this builds the CUDA
# area alone (tests/cuda/CMakeLists.txt: olmosft_cuda + the cuda_*_test binaries from cmake/cuda.cmake, sm_90 +
# PTX), prints the GPU, and runs the CUDA test binaries (those `ctest -R cuda` runs) with
# OLMOSFT_REQUIRE_CUDA_DEVICE=1 (a test that cannot see the device fails instead of skipping); then, when they
# all passed, the benchmark (cuda_bench_test with OLMOSFT_CUDA_BENCH=1: GEMM and fused CE timings).
# GPU_CHECK_SANITIZE=1 adds compute-sanitizer memcheck over every test binary (not the benchmark);
# GPU_CHECK_BENCH=0 skips the benchmark. cuBLASLt: the toolkit's; if it has none, a pip wheel's
# (python3 -c 'import nvidia.cublas'), passed as -DOLMOSFT_CUBLAS_ROOT.
# The log goes to $OUT/gpu-check.log and a results table (per test binary, then the benchmark lines) to
# $OUT/gpu-check-results.md when OUT is set (the device tool's output folder), else to the build folder.
#
#   scripts/gpu-check.sh --stage   here, once: copy GoogleTest's source (/usr/src/googletest, which the GPU
#                                  image lacks) to deps/googletest (git-ignored), to be carried
#   scripts/gpu-check.sh           there: device tool run, carry ["deps/googletest"], timeout_s 480
# Env: BUILD (default build-gpu), OLMOSFT_GTEST_SOURCE (a GoogleTest source tree; default deps/googletest if
# present, else an installed GoogleTest). Exit status 0 only when everything passed.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1

if [[ "${1:-}" == "--stage" ]]; then
  src="${OLMOSFT_GTEST_SOURCE:-/usr/src/googletest}"
  [[ -f "$src/CMakeLists.txt" ]] || { echo "gpu-check: no GoogleTest source at $src" >&2; exit 1; }
  rm -rf deps/googletest && cp -r "$src" deps/googletest
  echo "gpu-check: staged $src in deps/googletest ($(du -sh deps/googletest | cut -f1)); carry deps/googletest"
  exit 0
fi

build="${BUILD:-build-gpu}"
mkdir -p "$build"
log="${OUT:-$build}/gpu-check.log"
results="${OUT:-$build}/gpu-check-results.md"  # one table row per test binary, then the benchmark lines

check() {
  local status=0
  echo "== gpu-check $(date -u +%FT%TZ), $(git rev-parse --short HEAD 2>/dev/null || echo 'no git'), $(nproc) CPUs"
  echo "== nvidia-smi"
  nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total,clocks.max.sm --format=csv || status=1
  if ! command -v nvcc >/dev/null && [[ -x /usr/local/cuda/bin/nvcc ]]; then export PATH="/usr/local/cuda/bin:$PATH"; fi
  echo "== $(nvcc --version | tail -1); $(cmake --version | head -1); $(c++ --version | head -1)"

  local gtest=()
  if [[ -n "${OLMOSFT_GTEST_SOURCE:-}" ]]; then
    gtest=("-DOLMOSFT_GTEST_SOURCE=$OLMOSFT_GTEST_SOURCE")
  elif [[ -f deps/googletest/CMakeLists.txt ]]; then
    gtest=("-DOLMOSFT_GTEST_SOURCE=$PWD/deps/googletest")
  fi
  local cublas=()
  if ! ls /usr/local/cuda/lib64/libcublasLt.so* >/dev/null 2>&1; then
    local root
    root=$(python3 -c 'import nvidia.cublas, os; print(os.path.dirname(nvidia.cublas.__file__))' 2>/dev/null ||
      python3 -c 'import nvidia.cublas; print(list(nvidia.cublas.__path__)[0])' 2>/dev/null)
    if [[ -n "$root" ]]; then
      echo "== no cuBLASLt in /usr/local/cuda: using the wheel's at $root"
      cublas=("-DOLMOSFT_CUBLAS_ROOT=$root")
      export LD_LIBRARY_PATH="$root/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    fi
  fi
  echo "== configure + build (tests/cuda, CUDA required)"
  local t0=$SECONDS
  if ! cmake -S tests/cuda -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release "${gtest[@]}" "${cublas[@]}" >"$build/configure.log" 2>&1; then
    tail -40 "$build/configure.log"
    echo "== gpu-check: FAIL (configure)"
    return 1
  fi
  grep -- "-- CUDA:" "$build/configure.log"
  if ! cmake --build "$build" -j "$(nproc)" >"$build/build.log" 2>&1; then
    grep -E -B2 -A8 "error|FAILED" "$build/build.log" | head -60
    echo "== gpu-check: FAIL (build)"
    return 1
  fi
  echo "configured and built in $((SECONDS - t0)) s"

  local t rc
  printf '| test binary | result | s |\n|---|---|---|\n' >"$results"
  for t in "$build"/*_test; do
    [[ "$t" == */cuda_bench_test ]] && continue
    echo "== $t (OLMOSFT_REQUIRE_CUDA_DEVICE=1)"
    t0=$SECONDS
    OLMOSFT_REQUIRE_CUDA_DEVICE=1 timeout 120 "$t" --gtest_brief=1
    rc=$?
    [[ $rc == 0 ]] || status=1
    echo "   ($((SECONDS - t0)) s, exit $rc)"
    echo "| $(basename "$t") | $([[ $rc == 0 ]] && echo pass || echo "FAIL ($rc)") | $((SECONDS - t0)) |" >>"$results"
  done
  if [[ "${GPU_CHECK_SANITIZE:-0}" == 1 ]]; then
    for t in "$build"/*_test; do
      [[ "$t" == */cuda_bench_test ]] && continue
      echo "== compute-sanitizer memcheck $t"
      OLMOSFT_REQUIRE_CUDA_DEVICE=1 timeout 300 compute-sanitizer --tool memcheck --error-exitcode 1 "$t" --gtest_brief=1 || status=1
    done
  fi
  if [[ $status == 0 && "${GPU_CHECK_BENCH:-1}" == 1 && -x "$build/cuda_bench_test" ]]; then
    echo "== benchmark (OLMOSFT_CUDA_BENCH=1)"
    OLMOSFT_CUDA_BENCH=1 OLMOSFT_REQUIRE_CUDA_DEVICE=1 timeout 120 "$build/cuda_bench_test" >"$build/bench.log" 2>&1 ||
      status=1
    cat "$build/bench.log"
    { echo; echo '```'; grep '^bench ' "$build/bench.log"; echo '```'; } >>"$results"
  fi
  echo "== results ($results)"
  cat "$results"
  echo "== gpu-check: $([[ $status == 0 ]] && echo PASS || echo FAIL)"
  return $status
}

check 2>&1 | tee "$log"
exit "${PIPESTATUS[0]}"
