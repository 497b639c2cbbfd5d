#!/usr/bin/env bash
# A refactor changes no number (docs/numerics.md): this compares two builds on THIS machine, bit for bit.
#   scripts/bitwise-compare.sh BASE_REF [BUILD]
# BASE_REF (a commit, e.g. origin/main or HEAD~1) is built in a temporary git worktree; BUILD (default build/)
# is the working tree's build. Both then:
#   1. dump the hashes of every model number (ModelBitwise.Repeatable with OLMOSFT_BITWISE_DUMP: initial
#      parameters, loss parts, gradients, logits, log-probs of both families, both fp32 GEMM libraries), when
#      the base has that dump;
#   2. train the tiny Olmo 3, the tiny hybrid and a tiny Olmo Hybrid (the GVA fixture) for 6 steps each on the
#      byte-tokenised golden conversations (2 threads) and export them.
# and the script compares the dumps, the LOSS-PARTS lines and the sha256 of every exported file. Exit 0 only
# when everything is identical. Uses about 2 builds' time; the temporary tree is removed at the end.
# BASE_BUILD=DIR uses an existing build of BASE_REF instead (e.g. the base's own worktree build): no rebuild.
set -uo pipefail
base=${1:?usage: scripts/bitwise-compare.sh BASE_REF [BUILD]}
root=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "${2:-$root/build}" && pwd) || exit 2
work=$(mktemp -d "${TMPDIR:-/tmp}/olmosft-bitwise.XXXXXX")
trap 'git -C "$root" worktree remove --force "$work/base" >/dev/null 2>&1; rm -rf "$work"' EXIT
sha=$(git -C "$root" rev-parse --verify "$base^{commit}") || { echo "bitwise-compare: no commit $base"; exit 2; }
echo "bitwise-compare: base $base ($sha) vs the working tree ($build)"
[ -x "$build/olmosft" ] || { echo "bitwise-compare: $build/olmosft missing: build first"; exit 2; }
if [ -n "${BASE_BUILD:-}" ]; then
  base_build=$(cd "$BASE_BUILD" && pwd) || exit 2
  [ -x "$base_build/olmosft" ] && [ -x "$base_build/model_bitwise_test" ] ||
    { echo "bitwise-compare: BASE_BUILD=$BASE_BUILD has no olmosft / model_bitwise_test"; exit 2; }
  echo "bitwise-compare: using the base build $base_build (BASE_BUILD; it must be a build of $sha)"
else
  base_build=$work/base-build
  git -C "$root" worktree add -q --detach "$work/base" "$sha" || exit 2
  # What scripts/install-deps.sh put under deps/ (git-ignored: the venv with Arrow C++, the plugins, ...) is shared.
  for d in "$root"/deps/*/; do
    d=${d%/}
    [ -e "$work/base/deps/$(basename "$d")" ] || ln -s "$d" "$work/base/deps/$(basename "$d")"
  done
  echo "bitwise-compare: building the base (cmake, $(nproc) jobs)"
  # OLMOSFT_CUDA=OFF: a base from before src/cuda was removed (issue #29) would otherwise build it with nvcc
  cmake -S "$work/base" -B "$base_build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DOLMOSFT_CUDA=OFF >/dev/null || exit 2
  cmake --build "$base_build" -j "$(nproc)" --target olmosft model_bitwise_test >"$work/base-build.log" 2>&1 ||
    { tail -20 "$work/base-build.log"; echo "bitwise-compare: the base does not build"; exit 2; }
fi

fails=0
same() {  # same WHAT A B: compares two files
  if cmp -s "$2" "$3"; then echo "same: $1"; else echo "DIFFERENT: $1"; diff "$2" "$3" | head -8; fails=$((fails + 1)); fi
}

# 1. The model's numbers.
for side in base head; do
  b=$build
  [ $side = base ] && b=$base_build
  OLMOSFT_BITWISE_DUMP="$work/$side.hashes" "$b/model_bitwise_test" --gtest_filter=ModelBitwise.Repeatable \
    >"$work/$side.bitwise.log" 2>&1
done
if [ -s "$work/base.hashes" ] && [ -s "$work/head.hashes" ]; then
  same "model numbers ($(wc -l <"$work/head.hashes") hashes: both families, both GEMM libraries)" \
    "$work/base.hashes" "$work/head.hashes"
elif [ -s "$work/head.hashes" ]; then
  echo "note: the base predates OLMOSFT_BITWISE_DUMP; compared training runs only"
else
  echo "DIFFERENT: the working tree's model_bitwise_test wrote no dump"; fails=$((fails + 1))
fi

# 2. Training runs and exports.
G=$root/tests/golden
"$build/olmosft" data build --input "$G/data/convs.jsonl" --tokenizer builtin:bytes --seq-len 256 --seed 3 \
  --epochs 4 --quiet --out "$work/data" >/dev/null 2>&1 || { echo "bitwise-compare: data build failed"; exit 2; }
for model in olmo3_tiny olmo3moe_tiny hf_olmo_hybrid/gva; do
  name=${model//\//_}
  for side in base head; do
    bin=$build/olmosft
    [ $side = base ] && bin=$base_build/olmosft
    cat >"$work/recipe.yaml" <<YAML
output_dir: $work/runs-$side
run_name: $name
model:
  init: $G/model/$model
tokenizer: builtin:bytes
data:
  path: $work/data
  epochs: 4
seq_len: 256
global_batch: 4
per_device_batch: 2
steps: 6
optimizer:
  lr: 3e-3
  schedule: constant
  warmup_frac: 0.0
compute:
  threads: 2
perf:
  peak_tflops: 1
eval:
  heldout: 4
log:
  tensorboard: false
YAML
    "$bin" train "$work/recipe.yaml" </dev/null \
      >"$work/$name.$side.out" 2>&1
    grep '^LOSS-PARTS' "$work/$name.$side.out" >"$work/$name.$side.loss"
    (cd "$work/runs-$side/$name/hf" 2>/dev/null && sha256sum -- * | sort) >"$work/$name.$side.export"
  done
  if [ ! -s "$work/$name.head.loss" ]; then
    echo "DIFFERENT: $name: the working tree's run logged no LOSS-PARTS"; tail -5 "$work/$name.head.out"
    fails=$((fails + 1))
    continue
  fi
  same "$name: $(wc -l <"$work/$name.head.loss") LOSS-PARTS lines" "$work/$name.base.loss" "$work/$name.head.loss"
  same "$name: exported files (sha256)" "$work/$name.base.export" "$work/$name.head.export"
done
echo "bitwise-compare: $fails differences"
[ $fails -eq 0 ]
