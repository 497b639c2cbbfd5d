#!/usr/bin/env bash
# The container image the k8s manifests name (issue #15): ./Dockerfile is linted with hadolint (installed by
# scripts/install-deps.sh into deps/lint/; without it the test fails), and the invariants the rendered
# manifests depend on are checked against what `olmosft k8s render` writes for every shipped
# recipes/*.k8s.yaml: the image name, the command the pods run, the binary's path, a non-root user, the Debian
# base. The image itself is built by `make image` (scripts/build-image.sh), not here.
set -u
bin=$1
out=${2:-$(mktemp -d)}
root=$(cd "$(dirname "$0")/../.." && pwd)
df="$root/Dockerfile"
. "$(dirname "${BASH_SOURCE[0]}")/lib/check.sh"  # pass, fails, check, finish
rm -rf "$out" && mkdir -p "$out"

hadolint="${OLMOSFT_HADOLINT:-$root/deps/lint/hadolint}"
if [ -x "$hadolint" ]; then
  lint=$("$hadolint" --no-color "$df" 2>&1); rc=$?
  echo "$lint"
  check "hadolint Dockerfile: no findings ($("$hadolint" --version))" "[ $rc -eq 0 ] && [ -z \"\$lint\" ]"
  # The linter can fail: a Dockerfile with a known finding (DL3007, FROM ...:latest) is reported.
  printf 'FROM debian:latest\nUSER 1000\n' >"$out/bad.Dockerfile"
  bad=$("$hadolint" --no-color "$out/bad.Dockerfile" 2>&1); rc=$?
  check "hadolint reports a known finding (DL3007)" "[ $rc -ne 0 ] && grep -q DL3007 <<<\"\$bad\""
else
  check "hadolint installed at $hadolint (scripts/install-deps.sh installs it)" "false"
fi

# What the Dockerfile documents and does.
image=$(sed -n 's/^#   image: \(.*\)$/\1/p' "$df")
check "the Dockerfile documents one image name" "[ -n \"$image\" ] && [ \$(grep -c '^#   image: ' \"$df\") -eq 1 ]"
check "its build line tags that image" "grep -qF \"docker build -t $image .\" \"$df\""
check "ENTRYPOINT is /usr/local/bin/olmosft" "grep -qxF 'ENTRYPOINT [\"/usr/local/bin/olmosft\"]' \"$df\""
check "the binary is staged at /usr/local/bin/olmosft" \
  "grep -qF 'cp build/olmosft /stage/usr/local/bin/olmosft' \"$df\" && grep -qF 'COPY --from=build /stage/ /' \"$df\""
check "PATH is the base image's (it holds /usr/local/bin)" "! grep -q '^ENV PATH' \"$df\""
check "the final stage runs as a non-root numeric user" "[ \"\$(grep '^USER ' \"$df\" | tail -1)\" = 'USER 1000:1000' ]"
check "both stages are the Debian 12 BASE (debian:bookworm, or scripts/build-image.sh's debootstrapped one)" \
  "grep -qx 'ARG BASE=debian:bookworm' \"$df\" && [ \"\$(grep '^FROM ' \"$df\" | head -1)\" = 'FROM \${BASE} AS build' ] && [ \"\$(grep '^FROM ' \"$df\" | tail -1)\" = 'FROM \${BASE}' ]"
check "no '# syntax' line (BuildKit would reach a registry for it; buildah ignores it)" "! grep -q '^# *syntax' \"$df\""
# device: xla in the image (docs/xla.md "The image"): the three PJRT plugins staged under /opt/olmosft/pjrt and
# named by OLMOSFT_PJRT_* (src/xla/pjrt_plugin.cpp reads them), every wheel of the CUDA plugin's set pinned by a
# sha256 and installed with --require-hashes, and the build checks the CPU plugin compiles a step.
for v in CPU:cpu/xla_cpu_pjrt.so CUDA:cuda/jax_plugins/xla_cuda13/xla_cuda_plugin.so TPU:tpu/libtpu.so; do
  check "ENV OLMOSFT_PJRT_${v%%:*} points at the staged plugin /opt/olmosft/pjrt/${v#*:}" \
    "grep -qE '^ *(ENV )?OLMOSFT_PJRT_${v%%:*}=/opt/olmosft/pjrt/${v#*:}( |$)' \"$df\" && grep -q 'OLMOSFT_PJRT_${v%%:*}' '$root/src/xla/pjrt_plugin.cpp'"
done
check "the CUDA plugin's wheels are installed with --require-hashes from deps/pypi/cuda-plugin.txt" \
  "grep -q -- '--require-hashes --target /stage/opt/olmosft/pjrt/cuda' \"$df\" && grep -q -- '-r deps/pypi/cuda-plugin.txt' \"$df\""
reqs="$root/deps/pypi/cuda-plugin.txt"
check "every requirement in deps/pypi/cuda-plugin.txt is pinned (==) with a sha256 (14 wheels)" \
  "[ \$(grep -cE '^[a-z0-9-]+==[0-9.]+ --hash=sha256:[0-9a-f]{64}' \"$reqs\") -eq 14 ] && [ \$(grep -cvE '^(#|$)' \"$reqs\") -eq 14 ]"
check "the image build compiles a step on the staged CPU plugin" \
  "grep -qF 'olmosft xla compile --config olmo3-tiny --seq 64 --plugin cpu' \"$df\""
check ".dockerignore keeps build outputs and environments out" \
  "grep -qx 'build\*/' \"$root/.dockerignore\" && grep -qx 'deps/venv/' \"$root/.dockerignore\""

# What the manifests of every shipped k8s recipe name, as rendered.
for recipe in "$root"/recipes/*.k8s.yaml; do
  name=$(basename "$recipe" .yaml)
  r=$("$bin" k8s render "$recipe" --suffix e2e --out "$out/$name" 2>&1); rc=$?
  check "$name renders" "[ $rc -eq 0 ]" || echo "$r"
  c=$(jq -c '.objects[-1].object.spec.replicatedJobs[0].template.spec.template.spec.containers[0]' \
    "$out/$name/manifest.json")
  check "$name: the pods run the Dockerfile's image ($image)" "[ \"\$(jq -r .image <<<'$c')\" = '$image' ]"
  check "$name: the pods' command is olmosft on PATH (/usr/local/bin/olmosft in the image)" \
    "[ \"\$(jq -r '.command[0]' <<<'$c')\" = olmosft ]"
  check "$name: the recipe is mounted at /etc/olmosft, which the image leaves free" \
    "[ \"\$(jq -r '.volumeMounts[0].mountPath' <<<'$c')\" = /etc/olmosft ] && ! grep -q /etc/olmosft \"$df\""
done
finish
