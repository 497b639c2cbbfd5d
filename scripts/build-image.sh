#!/usr/bin/env bash
# Builds the olmosft image (./Dockerfile) on this machine without any registry (issue #47; docs/k8s.md "The
# image"): a Debian 12 base made with debootstrap from the Debian mirror, imported as a local image, then the
# Dockerfile built on it with buildah. Usage: scripts/build-image.sh [TAG] (default olmosft:latest); then
# scripts/test-image.sh [TAG], and `buildah push TAG docker://REGISTRY/PATH:TAG` to publish it.
#
# What this machine needs (measured, issue #47): buildah's chroot isolation and the host network (no
# namespaces to spare inside a container), the docker format (the OCI one drops SHELL silently: RUN would
# fall back to /bin/sh and lose pipefail), the vfs storage driver where overlay cannot mount, and pip's CA
# bundle mounted into the build (PIP_CERT) where PyPI is reached through a proxy with its own CA.
set -euo pipefail
cd "$(dirname "$0")/.."
tag=${1:-olmosft:latest}
base=${OLMOSFT_IMAGE_BASE:-localhost/olmosft-base:bookworm}
mirror=${OLMOSFT_DEBIAN_MIRROR:-http://deb.debian.org/debian}
export STORAGE_DRIVER=${STORAGE_DRIVER:-vfs} BUILDAH_ISOLATION=chroot
t0=$(date +%s)
log() { echo "build-image: $* ($(($(date +%s) - t0)) s)"; }

scripts/install-deps.sh --image  # debootstrap, buildah (deps/image/apt-image.txt)

if buildah inspect --type image "$base" >/dev/null 2>&1; then
  log "base $base exists"
else
  root=$(mktemp -d /tmp/olmosft-rootfs.XXXXXX)
  trap 'rm -rf "$root" "$root.log"' EXIT
  log "debootstrap --variant=minbase bookworm from $mirror"
  debootstrap --variant=minbase bookworm "$root" "$mirror" >"$root.log" 2>&1 || { tail -20 "$root.log"; exit 1; }
  rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
  ctr=$(buildah from scratch)
  mnt=$(buildah mount "$ctr")
  tar -C "$root" -cf - . | tar -C "$mnt" -xf -
  buildah umount "$ctr" >/dev/null
  buildah config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin --cmd /bin/bash "$ctr"
  buildah commit --quiet --format docker "$ctr" "$base" >/dev/null
  buildah rm "$ctr" >/dev/null
  log "base $base imported"
fi

ca_args=()
ca=${PIP_CERT:-}
if [[ -n "$ca" && -f "$ca" ]]; then
  ca_args=(--volume "$ca:/run/olmosft-pip-ca.crt:ro" --build-arg PIP_CERT=/run/olmosft-pip-ca.crt)
fi
log "buildah bud -t $tag (BASE=$base)"
buildah bud --isolation chroot --network host --layers --format docker --build-arg BASE="$base" \
  "${ca_args[@]}" -t "$tag" .
size=$(buildah images --format '{{.Size}}' "$tag" 2>/dev/null | head -1)
log "built $tag (${size:-size unknown})"
