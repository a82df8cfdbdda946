# make demo | make test | make bench | make sanitize | make clean
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

.PHONY: all deps build demo test test-cpp test-python bench clean

all: build

$(STAMPS)/apt:
	@mkdir -p $(STAMPS)
	@missing=$$(for p in $(APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages: $$missing"; \
	  SUDO=$$( [ $$(id -u) -eq 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$missing; \
	fi
	@touch $@

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

bench: build
	$(PY) bench/run_all.py

clean:
	rm -rf $(BUILD) python/max_device/_C*.so python/max_device/libmax_device_loader.so python/max_device/sdk
