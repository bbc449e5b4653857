# Every target does its own set-up: a virtual environment with pinned dependencies.
# torch: the interpreter's own where it has one with a GPU, else the CPU build 2.13.0.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
ARGS   ?=
TARGET ?= bundled

.PHONY: check test clean setup build amd-build-check nvidia-build-check report

setup: $(VENV)/.ready

$(VENV)/.ready: requirements.txt pyproject.toml
	@if $(PYTHON) -c "import torch,sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then \
	  echo "setup: using the interpreter's own torch (GPU present)"; \
	  $(PYTHON) -m venv --system-site-packages $(VENV); \
	else \
	  $(PYTHON) -m venv $(VENV) && $(VENV)/bin/pip install -q torch==2.13.0; \
	fi
	$(VENV)/bin/pip install -q -r requirements.txt
	@touch $@

build: setup
	$(PY) -m kernels.build

check: setup
	$(PY) -m harness check --target $(TARGET) $(ARGS)

test: setup
	$(PY) -m pytest tests -n auto --reruns 2 -q $(ARGS)

amd-build-check: setup
	$(PY) -m kernels.build --platform amd --arch gfx90a,gfx940 --compile-only

nvidia-build-check: setup
	$(PY) -m kernels.build --platform nvidia --arch sm_90 --compile-only

clean:
	rm -rf $(VENV) .cache results reports/out
