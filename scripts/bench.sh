#!/usr/bin/env bash
# Runs every benchmark executable (build/bench_*; bench/*.cpp are compiled to bench_<name>) and collects
# their markdown output in bench/out/<name>.md (git-ignored), plus bench/out/summary.md with the machine.
# bench_train (training step vs PyTorch) runs its peer bench/train_torch.py twice: with /usr/bin/python3 (Debian's
# python3-torch 1.13) and with deps/venv-reference/bin/python (PyPI torch 2.15, CPU; scripts/install-deps.sh
# --reference). A missing interpreter gives "skipped" in that peer's columns, its header line and the BENCH line.
# Its cases take ~1.5-2.5 min together per peer on 2 loaded cores.
# bench_tokenizer runs its peer, HF tokenizers (Rust), with deps/venv-reference/bin/python
# (scripts/install-deps.sh --reference); without it, it prints "HF tokenizers: skipped: ...".
# Usage: scripts/bench.sh [build-dir]   (default: build)
set -euo pipefail
cd "$(dirname "$0")/.."
build="${1:-build}"
out=bench/out
mkdir -p "$out"
shopt -s nullglob
benches=("$build"/bench_*)
if ((${#benches[@]} == 0)); then
  echo "bench.sh: no $build/bench_* executables (run make build first)" >&2
  exit 1
fi
summary="$out/summary.md"
{
  echo "# olmosft benchmarks ($(date -u +%Y-%m-%dT%H:%M:%SZ))"
  echo
  echo "- CPU: $(lscpu | sed -n 's/^Model name: *//p' | head -1), $(nproc) logical CPUs"
  echo "- host: $(uname -srm); load average before the run: $(cut -d" " -f1-3 /proc/loadavg)"
  echo "- git: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
} >"$summary"
status=0
for exe in "${benches[@]}"; do
  [[ -x "$exe" && -f "$exe" ]] || continue
  name="${exe##*/bench_}"
  echo "== bench_$name"
  if "$exe" | tee "$out/$name.md.tmp"; then
    mv "$out/$name.md.tmp" "$out/$name.md"
    { echo; echo "## $name"; echo; cat "$out/$name.md"; } >>"$summary"
  else
    echo "bench.sh: bench_$name failed" >&2
    status=1
  fi
done
# bench_kda's GDN mode (Olmo Hybrid's Gated DeltaNet, with transformers' torch chunked path from
# deps/venv-reference as its peer; ~2.5 min on 2 loaded cores): bench/RESULTS.md "bench_kda --gdn".
if [[ -x "$build/bench_kda" ]]; then
  echo "== bench_kda --gdn"
  if "$build/bench_kda" --gdn --max-recurrent-tokens 65536 | tee "$out/kda_gdn.md.tmp"; then
    mv "$out/kda_gdn.md.tmp" "$out/kda_gdn.md"
    { echo; echo "## kda --gdn"; echo; cat "$out/kda_gdn.md"; } >>"$summary"
  else
    echo "bench.sh: bench_kda --gdn failed" >&2
    status=1
  fi
fi
echo "== dist_train (bench/dist_train.sh: olmosft train under mpirun, 1 vs 2 processes)"
if bench/dist_train.sh "$build" | tee "$out/dist_train.md.tmp"; then
  mv "$out/dist_train.md.tmp" "$out/dist_train.md"
  { echo; echo "## dist_train"; echo; cat "$out/dist_train.md"; } >>"$summary"
else
  echo "bench.sh: bench/dist_train.sh failed" >&2
  status=1
fi
echo "== zero3_memory (bench/zero3_memory.sh: peak RSS per rank under mpirun -np 1/2/4; ZERO3_BEFORE=<binary> adds a before row)"
if bench/zero3_memory.sh "$build" "${ZERO3_BEFORE:-}" | tee "$out/zero3_memory.md.tmp"; then
  mv "$out/zero3_memory.md.tmp" "$out/zero3_memory.md"
  { echo; echo "## zero3_memory"; echo; cat "$out/zero3_memory.md"; } >>"$summary"
else
  echo "bench.sh: bench/zero3_memory.sh failed" >&2
  status=1
fi
echo "bench.sh: results in $out/"
exit $status
