# The image the k8s manifests name (recipes/*.k8s.yaml, cluster.image; docs/k8s.md "The image"):
#   image: us-docker.pkg.dev/ai2-olmo/olmo/olmosft:latest
# Built here without any registry by `make image` (scripts/build-image.sh: a debootstrapped Debian 12 base,
# then buildah with this file); where Docker Hub is reachable also by
#   docker build -t us-docker.pkg.dev/ai2-olmo/olmo/olmosft:latest .
# Both stages are Debian 12 (BASE; the build stage's libraries are the runtime stage's, same distribution). It
# trains on CPUs (device: cpu) and through XLA (device: xla, docs/xla.md "The image") with the PJRT plugins it
# carries under /opt/olmosft/pjrt: XLA's CPU plugin, XLA's CUDA plugin with the NVIDIA libraries it loads (from
# PyPI wheels; the GPU driver's libcuda comes from the host through the NVIDIA container runtime), and libtpu;
# OLMOSFT_PJRT_CPU / _CUDA / _TPU point the plugin names cpu / cuda / tpu (recipe key xla.plugin) at them.
# No `# syntax` line (it makes BuildKit reach a registry) and no heredocs or COPY --link (buildah lacks them).
ARG BASE=debian:bookworm

FROM ${BASE} AS build
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
WORKDIR /src
COPY . .
# scripts/install-deps.sh installs deps/apt-*.txt and the pinned PyPI wheels (deps/pypi/build.txt) exactly as
# CI does. Portable code (no -march=native). PIP_CERT: a CA bundle for pip where PyPI is reached through a
# proxy with its own CA (scripts/build-image.sh mounts the host's at that path); empty: pip's own.
ARG PIP_CERT=
RUN if [ -z "$PIP_CERT" ]; then unset PIP_CERT; fi \
 && rm -rf build deps/venv deps/venv-reference deps/dolma2 \
 && scripts/install-deps.sh \
 && cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DOLMOSFT_NATIVE=OFF -DOLMOSFT_WERROR=OFF \
 && cmake --build build --target olmosft \
 && rm -rf /var/lib/apt/lists/*
# XLA's PJRT plugins: the CPU plugin and libtpu as install-deps.sh unpacks them (sha256-pinned in
# deps/pypi/files.txt); XLA's CUDA plugin and its NVIDIA libraries laid out as a pip install of JAX's CUDA 13
# plugin (jax_plugins/xla_cuda13 beside nvidia/*: the plugin's RPATH finds the libraries there), every wheel
# pinned by its sha256 in deps/pypi/cuda-plugin.txt.
RUN if [ -z "$PIP_CERT" ]; then unset PIP_CERT; fi \
 && scripts/install-deps.sh --tpu \
 && mkdir -p /stage/opt/olmosft/pjrt/cpu /stage/opt/olmosft/pjrt/tpu \
 && cp deps/xla/cpu/xla_cpu_pjrt.so /stage/opt/olmosft/pjrt/cpu/ \
 && cp deps/xla/tpu/libtpu.so /stage/opt/olmosft/pjrt/tpu/ \
 && deps/venv/bin/pip install --no-cache-dir --no-deps --require-hashes --target /stage/opt/olmosft/pjrt/cuda \
      -r deps/pypi/cuda-plugin.txt \
 && test -f /stage/opt/olmosft/pjrt/cuda/jax_plugins/xla_cuda13/xla_cuda_plugin.so
# Stage what the runtime needs under /stage: the binary, its shared libraries as ldd resolves them (the C
# library family excepted: the runtime base has the same ones), and the DuckDB CLI at the path compiled into
# the binary (`olmosft data --sql`).
RUN mkdir -p /stage/usr/local/bin /stage/opt/olmosft/lib \
 && cp build/olmosft /stage/usr/local/bin/olmosft \
 && ldd build/olmosft | awk '$2 == "=>" && $3 ~ /^\// {print $3}' \
    | grep -Ev '/(libc|libm|libdl|libpthread|librt|libresolv|ld-linux[^/]*)\.so' \
    | xargs -I{} cp -L {} /stage/opt/olmosft/lib/ \
 && duckdb="$(deps/venv/bin/python -c 'import duckdb_cli, os; print(os.path.join(os.path.dirname(duckdb_cli.__file__), "duckdb"))')" \
 && mkdir -p "/stage$(dirname "$duckdb")" && cp "$duckdb" "/stage$duckdb"

FROM ${BASE}
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# mpirun and Open MPI's run-time components (olmosft's multi-process Comm; plugins that ldd does not list).
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends openmpi-bin=4.1.* \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /stage/ /
ENV LD_LIBRARY_PATH=/opt/olmosft/lib \
    OLMOSFT_PJRT_CPU=/opt/olmosft/pjrt/cpu/xla_cpu_pjrt.so \
    OLMOSFT_PJRT_CUDA=/opt/olmosft/pjrt/cuda/jax_plugins/xla_cuda13/xla_cuda_plugin.so \
    OLMOSFT_PJRT_TPU=/opt/olmosft/pjrt/tpu/libtpu.so
# A non-root user, uid 1000; the build fails here if a library is missing.
RUN useradd --create-home --uid 1000 --user-group olmosft \
 && /usr/local/bin/olmosft --help >/dev/null \
 && /usr/local/bin/olmosft xla compile --config olmo3-tiny --seq 64 --plugin cpu >/dev/null
USER 1000:1000
WORKDIR /home/olmosft
ENTRYPOINT ["/usr/local/bin/olmosft"]
CMD ["--help"]
