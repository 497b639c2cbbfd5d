#!/usr/bin/env bash
# Runs the built image (scripts/build-image.sh; `make test-image`): olmosft --help, the three PJRT plugins
# where OLMOSFT_PJRT_* say and loadable (a step compiled on the CPU plugin; the CUDA and TPU plugins dlopen'ed
# by a deviceless compile is not possible without their devices' topologies here, so their files are checked),
# and two training steps of the tiny Olmo 3 fixture on XLA's CPU plugin inside the image, run as its non-root
# user (tests/golden mounted read-only, a scratch directory for the run). Usage: scripts/test-image.sh [TAG].
set -euo pipefail
cd "$(dirname "$0")/.."
tag=${1:-olmosft:latest}
export STORAGE_DRIVER=${STORAGE_DRIVER:-vfs} BUILDAH_ISOLATION=chroot
scratch=$(mktemp -d /tmp/olmosft-test-image.XXXXXX)
chmod 777 "$scratch"
ctr=$(buildah from --quiet "$tag")
cleanup() { buildah rm "$ctr" >/dev/null 2>&1 || true; rm -rf "$scratch"; }
trap cleanup EXIT
passed=0 failed=0
check() {  # check NAME COMMAND...: runs COMMAND in the image, as its user
  local name=$1 out
  shift
  if out=$(buildah run --isolation chroot --user 1000:1000 -v "$PWD/tests/golden:/golden:ro" \
    -v "$scratch:/scratch" "$ctr" -- "$@" 2>&1); then
    echo "ok: $name"
    passed=$((passed + 1))
  else
    echo "FAIL: $name"
    echo "$out" | tail -20
    failed=$((failed + 1))
  fi
}
check "olmosft --help" /usr/local/bin/olmosft --help
check "the three plugins where OLMOSFT_PJRT_* point" bash -c \
  'test -f "$OLMOSFT_PJRT_CPU" && test -f "$OLMOSFT_PJRT_CUDA" && test -f "$OLMOSFT_PJRT_TPU"'
check "mpirun is there" mpirun --version
check "a step compiled on the CPU plugin" olmosft xla compile --config olmo3-tiny --seq 64 --plugin cpu
cat >"$scratch/recipe.yaml" <<YAML
output_dir: /scratch/runs
model:
  init: /golden/model/olmo3_tiny
tokenizer: builtin:bytes
data:
  path: /scratch/data
seq_len: 256
global_batch: 4
per_device_batch: 2
steps: 2
device: xla
log:
  tensorboard: false
YAML
check "a dataset builds" olmosft data build --input /golden/data/convs.jsonl --tokenizer builtin:bytes \
  --seq-len 256 --seed 7 --epochs 1 --quiet --out /scratch/data
check "two training steps on XLA's CPU plugin, exported to HF" bash -c \
  'olmosft train /scratch/recipe.yaml run_name=img > /scratch/train.out 2>&1 && grep -q "^LOSS-PARTS step=2 " /scratch/train.out && test -f /scratch/runs/img/hf/config.json'
echo "test-image: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
