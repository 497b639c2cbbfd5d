#!/usr/bin/env bash
# src/kernels/gemm_onednn.cpp has two API paths: oneDNN 2.x (Debian 12's libdnnl 2.6, what `make test` builds
# and tests) and 3.x (e.g. Ubuntu 24.04's libdnnl, the container image's build stage). This compiles
# tests/onednn3/check.cpp with it against both and runs it: f32 and bf16 GEMMs, every transpose, alpha and beta,
# against float64. The 3.x build is PyPI's oneDNN 3.2 (onednn-cpu-gomp + onednn-devel-cpu-gomp 2023.2.0, GNU
# OpenMP: the library and its headers, ~40 MB of wheels downloaded into a temporary directory).
# Not part of `make test` (it downloads). Usage: scripts/check-onednn3.sh
set -euo pipefail
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
build() {  # build OUT [extra g++ flags...]
  local out=$1
  shift
  # (-I applies to every file wherever it stands; the libraries must follow the sources)
  g++ -std=c++20 -O2 -fopenmp -Wall -Wextra -Werror -Isrc tests/onednn3/check.cpp src/kernels/gemm_onednn.cpp "$@" \
    -o "$out"
}
echo "== oneDNN from the system (Debian's libdnnl-dev)"
build "$tmp/check2" -ldnnl
"$tmp/check2"
echo "== oneDNN 3.2 from PyPI"
python3 -m pip download --no-deps -q -d "$tmp/whl" onednn-cpu-gomp==2023.2.0 onednn-devel-cpu-gomp==2023.2.0
for w in "$tmp"/whl/*.whl; do unzip -q -o "$w" -d "$tmp/x"; done
inc=$(dirname "$(find "$tmp/x" -name dnnl.hpp -path '*/include/dnnl.hpp' | head -1)")
lib=$(dirname "$(find "$tmp/x" -name 'libdnnl.so.3' | head -1)")
build "$tmp/check3" -I"$inc" -L"$lib" -l:libdnnl.so.3 -Wl,-rpath,"$lib"
"$tmp/check3"
