# syntax=docker/dockerfile:1
# The image the k8s manifests name (recipes/*.k8s.yaml, cluster.image; docs/k8s.md "The image"):
#   image: us-docker.pkg.dev/ai2-olmo/olmo/olmosft:latest
#   docker build -t us-docker.pkg.dev/ai2-olmo/olmo/olmosft:latest .
# olmosft on NVIDIA's CUDA 13.0 runtime base. NVIDIA publishes no Debian flavour of nvidia/cuda, so both stages
# use its Ubuntu 24.04 images (the build stage's libraries are the runtime stage's, same distribution). This
# build of olmosft trains on CPUs only (device=cuda is refused at preflight, issue #15); the CUDA base is what a
# CUDA build will need, and the binary runs on CPU nodes too.
ARG CUDA_TAG=13.0.1

FROM nvidia/cuda:${CUDA_TAG}-devel-ubuntu24.04 AS build
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
WORKDIR /src
COPY . .
# scripts/install-deps.sh installs deps/apt-*.txt and the pinned PyPI wheels (deps/pypi/build.txt) exactly as
# CI does. Portable code (no -march=native); warnings are not errors with this distribution's newer GCC.
RUN rm -rf build deps/venv deps/venv-reference deps/dolma2 \
 && scripts/install-deps.sh \
 && cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DOLMOSFT_NATIVE=OFF -DOLMOSFT_WERROR=OFF \
      -DOLMOSFT_CUDA=OFF \
 && cmake --build build --target olmosft \
 && rm -rf /var/lib/apt/lists/*
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

FROM nvidia/cuda:${CUDA_TAG}-runtime-ubuntu24.04
# mpirun and Open MPI's run-time components (olmosft's multi-process Comm; plugins that ldd does not list).
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends openmpi-bin=4.1.* \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /stage/ /
ENV LD_LIBRARY_PATH=/opt/olmosft/lib
# A non-root user, uid 1000 (Ubuntu 24.04's own `ubuntu` user had it); the build fails here if a library is
# missing.
RUN if id -u ubuntu >/dev/null 2>&1; then userdel --remove ubuntu; fi \
 && useradd --create-home --uid 1000 --user-group olmosft \
 && /usr/local/bin/olmosft --help >/dev/null
USER 1000:1000
WORKDIR /home/olmosft
ENTRYPOINT ["/usr/local/bin/olmosft"]
CMD ["--help"]
