# make demo | make test | make bench | make sanitize | make fuzz | make clean
# Each target installs what is missing (Debian packages, a pinned virtual
# environment), builds incrementally, then runs. A second run with nothing
# changed takes seconds.

SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
BUILD := build
JOBS ?= $(shell nproc)
APT_PACKAGES := cmake g++ make pkg-config ccache libboost-dev libspdlog-dev libelf-dev libgtest-dev binutils
STAMPS := $(BUILD)/.stamps

.PHONY: all deps build demo test test-cpp test-python test-compat test-opinfo-full bench clean \
        sanitize sanitize-asan sanitize-tsan sanitize-build-asan sanitize-build-tsan sanitize-clean \
        leak-check fuzz fuzz-ci fuzz-build fuzz-seeds fuzz-clean

all: build

# apt_install: install the Debian packages of $(1) that are missing, then
# touch the target's stamp.
define apt_install
	@mkdir -p $(STAMPS)
	@missing=$$(for p in $(1); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages: $$missing"; \
	  SUDO=$$( [ $$(id -u) -eq 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$missing; \
	fi
	@touch $@
endef

$(STAMPS)/apt:
	$(call apt_install,$(APT_PACKAGES))

$(STAMPS)/venv: requirements.txt | $(STAMPS)/apt
	@[ -x $(PY) ] || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -r requirements.txt
	@# Development install: the venv imports max_device from python/.
	@echo "$(CURDIR)/python" > $$($(PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/max_device-dev.pth
	@touch $@

deps: $(STAMPS)/venv

$(BUILD)/Makefile: $(STAMPS)/venv CMakeLists.txt
	cmake -S . -B $(BUILD) -DPython3_EXECUTABLE=$(CURDIR)/$(PY) -DCMAKE_BUILD_TYPE=RelWithDebInfo

build: $(BUILD)/Makefile
	cmake --build $(BUILD) -j $(JOBS)
	@# The plugin SDK (header + CMake package) inside the Python package, for
	@# `python -m max_device --cmake-dir`.
	@cmake --install $(BUILD) --component plugin_api --prefix python/max_device/sdk >/dev/null

demo: build
	$(PY) examples/demo.py

test-cpp: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

test-python: build
	MAXDEV_BUILD_DIR=$(CURDIR)/$(BUILD) $(PY) -m pytest tests/python -q -ra

test: test-cpp test-python

# --- The full OpInfo run (not in CI): every shard of MAXDEV_OPINFO=full -----
# OPINFO_JOBS shards at a time (one core each), logs and JUnit XML in
# build/opinfo-full, a per-shard/per-configuration table at the end; fails
# when a shard has a failure not in test_opinfo.py's KNOWN_FAILURES.
OPINFO_SHARDS ?= 8
OPINFO_JOBS ?= 2
test-opinfo-full: build
	nice -n 5 $(PY) tests/opinfo/full_run.py --shards $(OPINFO_SHARDS) --jobs $(OPINFO_JOBS) \
	  --build-dir $(CURDIR)/$(BUILD) --out $(CURDIR)/$(BUILD)/opinfo-full

# --- Another PyTorch: make test-compat TORCH=2.14.1 (not in CI) ------------
# Its own venv (COMPAT_DIR/venv-TORCH, outside the repository: PyPI's CUDA
# wheels are several GB, and never a dependency of `make test`) and build tree
# (build-compat-TORCH, whose package goes to build-compat-TORCH/python), then
# ctest, pytest, and the cross-version test: this build's loader loads the
# plugins of the default build/ (built against the default torch) and checks
# them (tests/python/test_cross_version.py).
TORCH ?=
COMPAT_DIR ?= $(abspath $(CURDIR)/..)/compat
COMPAT_VENV = $(COMPAT_DIR)/venv-$(TORCH)
COMPAT_BUILD = build-compat-$(TORCH)

test-compat: build
	@[ -n "$(TORCH)" ] || { echo "usage: make test-compat TORCH=2.14.1" >&2; exit 2; }
	@[ -x $(COMPAT_VENV)/bin/python ] || $(PYTHON) -m venv $(COMPAT_VENV)
	@# setuptools with bdist_wheel for test_package.py's pip wheel (torch 2.12 wants <82).
	$(COMPAT_VENV)/bin/python -m pip install -q torch==$(TORCH) 'setuptools>=70.1' \
	  $$(grep -v '^torch==' requirements.txt | grep -v '^#')
	cmake -S . -B $(COMPAT_BUILD) -DPython3_EXECUTABLE=$(COMPAT_VENV)/bin/python -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	  -DMAXDEV_BUILD_BENCH=OFF -DMAXDEV_PACKAGE_DIR=$(CURDIR)/$(COMPAT_BUILD)/python/max_device
	cmake --build $(COMPAT_BUILD) -j $(JOBS)
	PY=$(COMPAT_VENV)/bin/python tests/compat/run.sh $(COMPAT_BUILD) $(BUILD)

bench: build
	$(PY) bench/run_all.py

# --- Sanitizers: make sanitize = sanitize-asan, then sanitize-tsan ----------
# Each has its own tree (build-asan: -fsanitize=address,undefined; build-tsan:
# -fsanitize=thread) whose loader, _C, plugins, fixtures and tests are all
# instrumented, and whose libraries go to <tree>/python/max_device (never
# python/). tests/sanitizers/run.sh runs ctest, then pytest with that package
# and the sanitizer runtime preloaded into Python; see tests/sanitizers/README.md.
# SAN_JOBS: build and ctest parallelism (CI has 2 cores).
SAN_JOBS ?= 2
SAN_RUN := PY=$(PY) CTEST_JOBS=$(SAN_JOBS) tests/sanitizers/run.sh
# pytest under ASan+UBSan: everything (OpInfo included).
SAN_ASAN_PYTEST ?=
# pytest under TSan: the tests that run threads (plugin threads, hot swap,
# the watcher), load/unload/swap/override/validate plugins (the bad-plugin
# corpus, kernel faults and trust checks included), change the fallback and
# move data zero-copy, rebuild plugins under watch and reload loops (4
# rebuilds per writer under TSan), fork and exit; OpInfo and the pure op,
# dtype, view and factory tests run no thread or loader path that these do not.
# Not test_plugin_fast.py: the fast plugin's threads are libgomp's workers,
# whose barriers TSan cannot see (run.sh pins OMP_NUM_THREADS=1 for that).
SAN_TSAN_PYTEST ?= tests/python/test_plugin_threads.py tests/python/test_hot_swap.py \
  tests/python/test_watch.py tests/python/test_overrides.py tests/python/test_validation.py \
  tests/python/test_plugin_lifecycle.py \
  tests/python/test_plugin_decline.py tests/python/test_plugin_errors.py tests/python/test_kernel_faults.py \
  tests/python/test_trust.py tests/python/test_snapshot_cleanup.py \
  tests/python/test_plugin_custom_op.py tests/python/test_plugin_listing.py \
  tests/python/test_plugin_reference_ops.py tests/python/test_fallback_policy.py \
  tests/python/test_zero_copy.py tests/python/test_memory.py tests/python/test_generator.py \
  tests/python/test_logging.py tests/python/test_autograd.py \
  tests/python/test_process_life.py tests/python/test_rebuild_safety.py tests/python/test_rebuild_stress.py \
  tests/python/test_plugin_files.py tests/python/test_docs.py tests/python/test_direct_fallback.py \
  tests/python/test_call_path.py

build-asan/Makefile: $(STAMPS)/venv CMakeLists.txt
	cmake -S . -B build-asan -DPython3_EXECUTABLE=$(CURDIR)/$(PY) -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	  -DMAXDEV_SANITIZE=address,undefined -DMAXDEV_BUILD_BENCH=OFF \
	  -DMAXDEV_PACKAGE_DIR=$(CURDIR)/build-asan/python/max_device

build-tsan/Makefile: $(STAMPS)/venv CMakeLists.txt
	cmake -S . -B build-tsan -DPython3_EXECUTABLE=$(CURDIR)/$(PY) -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	  -DMAXDEV_SANITIZE=thread -DMAXDEV_BUILD_BENCH=OFF \
	  -DMAXDEV_PACKAGE_DIR=$(CURDIR)/build-tsan/python/max_device

sanitize-build-asan: build-asan/Makefile
	cmake --build build-asan -j $(SAN_JOBS)

sanitize-build-tsan: build-tsan/Makefile
	cmake --build build-tsan -j $(SAN_JOBS)

sanitize-asan: sanitize-build-asan
	$(SAN_RUN) asan build-asan cpp
	$(SAN_RUN) asan build-asan python $(SAN_ASAN_PYTEST)

sanitize-tsan: sanitize-build-tsan
	$(SAN_RUN) tsan build-tsan cpp
	MAXDEV_REBUILDS=4 $(SAN_RUN) tsan build-tsan python $(SAN_TSAN_PYTEST)

# No leak per plugin load/unload cycle (LeakSanitizer, 1 vs 50 cycles; see
# tests/sanitizers/leak_check.sh). Uses the plain build: about 30 s.
leak-check: build
	PY=$(PY) tests/sanitizers/leak_check.sh

sanitize: sanitize-asan sanitize-tsan leak-check

# --- Fuzzing: the manifest and ELF reading path (tests/fuzz/README.md) ------
# libFuzzer targets built with clang into build-fuzz/ from manifest.cpp and a
# harness, with ASan+UBSan (LeakSanitizer on). Seeds: the real plugins of
# build/. New inputs collect in build-fuzz/corpus/<target>, crashes in
# build-fuzz/artifacts/. One process, one core. FUZZ_SECONDS is per target.
FUZZ_BUILD := build-fuzz
FUZZ_TARGETS := manifest_image manifest_records
FUZZ_SECONDS ?= 600
FUZZ_CI_SECONDS ?= 30
FUZZ_CXX := clang++-14
FUZZ_CXXFLAGS := -std=c++17 -g -O1 -fno-omit-frame-pointer -fsanitize=fuzzer,address,undefined \
  -fno-sanitize-recover=undefined -Iloader -Iplugin_api/include -Itests/fuzz
FUZZ_INPUTS := loader/plugins/manifest.cpp loader/plugins/manifest.h loader/plugins/errors.h \
  plugin_api/include/max_device/plugin.h tests/fuzz/elf_regions.h
# -timeout: seconds one input may take (a hang); -rss_limit_mb: memory.
FUZZ_OPTIONS := -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 -dict=tests/fuzz/manifest.dict

$(STAMPS)/apt-fuzz:
	$(call apt_install,clang-14 libclang-rt-14-dev)

$(FUZZ_BUILD)/fuzz_%: tests/fuzz/fuzz_%.cpp $(FUZZ_INPUTS) | $(STAMPS)/apt-fuzz
	@mkdir -p $(FUZZ_BUILD)
	$(FUZZ_CXX) $(FUZZ_CXXFLAGS) -o $@ $< loader/plugins/manifest.cpp -lelf

fuzz-build: $(addprefix $(FUZZ_BUILD)/fuzz_,$(FUZZ_TARGETS))

fuzz-seeds: build
	tests/fuzz/make_seeds.sh $(BUILD) $(FUZZ_BUILD)/seeds

# fuzz_run: one target. The first corpus directory receives new inputs.
define fuzz_run
	@mkdir -p $(FUZZ_BUILD)/corpus/$(1) $(FUZZ_BUILD)/artifacts
	$(FUZZ_BUILD)/fuzz_$(1) $(FUZZ_OPTIONS) -max_total_time=$(FUZZ_SECONDS) \
	  -artifact_prefix=$(FUZZ_BUILD)/artifacts/$(1)- $(FUZZ_BUILD)/corpus/$(1) $(FUZZ_BUILD)/seeds/$(1)

endef

fuzz: fuzz-build fuzz-seeds
	$(foreach t,$(FUZZ_TARGETS),$(call fuzz_run,$(t)))

fuzz-ci:
	$(MAKE) fuzz FUZZ_SECONDS=$(FUZZ_CI_SECONDS)

fuzz-clean:
	rm -rf $(FUZZ_BUILD)

clean:
	rm -rf $(BUILD) python/max_device/_C*.so python/max_device/libmax_device_loader.so python/max_device/sdk

sanitize-clean:
	rm -rf build-asan build-tsan
