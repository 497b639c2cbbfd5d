# olmosft: the two entry points are `make demo` and `make test`; both install what they need first.
BUILD ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?= -DCMAKE_BUILD_TYPE=Release -DOLMOSFT_WERROR=ON

.PHONY: all deps build test test-tpu image test-image demo demo-xla bench reference fuzz format clean

all: build

# --cuda: XLA's CUDA plugin and the CUDA toolkit parts its deviceless compile reads (libcudart, libnvJitLink,
# libdevice; 4 wheels, 240 MB; measured 10 s here from scratch), so that make test compiles a 16-GPU step
# without a GPU (tests/unit/train/train_compiled_plan_test.cpp; docs/plan.md).
deps:
	scripts/install-deps.sh --cuda

$(BUILD)/build.ninja:
	cmake -S . -B $(BUILD) -G Ninja $(CMAKE_FLAGS)

build: deps $(BUILD)/build.ninja
	cmake --build $(BUILD) -j $(JOBS)

# ctest, then the skip and hygiene checks (scripts/run-tests.sh, docs/testing.md).
test: build
	scripts/run-tests.sh $(BUILD) $(JOBS)

# The TPU compile checks (libtpu, an opt-in install: install-deps.sh --tpu; scripts/tpu-compile-check.sh):
# the steps and the 7B recipe compiled ahead of time for TPU v4 slices, outside make test (about 3 minutes).
test-tpu: build
	scripts/tpu-compile-check.sh

# The container image (./Dockerfile) built here from a debootstrapped Debian 12 base with buildah, no registry
# (scripts/build-image.sh; 7 min 47 s on 2 cores from scratch, 4.43 GB, outside make test), and run
# (scripts/test-image.sh: 9 s).
image:
	scripts/build-image.sh olmosft:latest

test-image:
	scripts/test-image.sh olmosft:latest

demo: build
	scripts/demo.sh $(BUILD) demo-out

# The same demo with the training step on XLA's CPU plugin (device: xla, docs/xla.md).
demo-xla: build
	scripts/demo.sh $(BUILD) demo-out-xla device=xla

bench: build
	scripts/bench.sh $(BUILD)

# Regenerate golden fixtures with the independent references (PyTorch, Jinja2) and the upstream oracles
# (transformers; the export cross-check runs the built olmosft); not part of make test.
reference: build
	scripts/install-deps.sh --reference
	OLMOSFT=$(BUILD)/olmosft scripts/make-fixtures.sh

# libFuzzer targets (clang++ + compiler-rt, ASan + UBSan; docs/fuzz.md): each mutated for FUZZ_SECONDS from its
# seed corpus, FUZZ_JOBS at a time; exits non-zero on a finding. Not part of make test (which replays the
# seed corpora only).
FUZZ_SECONDS ?= 60
FUZZ_JOBS ?= 1
fuzz: deps $(BUILD)/build.ninja
	FUZZ_SECONDS=$(FUZZ_SECONDS) FUZZ_JOBS=$(FUZZ_JOBS) tests/fuzz/run.sh $(BUILD)

format:
	git ls-files '*.cpp' '*.h' | xargs clang-format -i

clean:
	rm -rf $(BUILD)
