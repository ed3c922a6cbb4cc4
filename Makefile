# The two commands of the README:
#   make book   build the rendered book into _build/html (sets everything up first)
#   make test   run every test: unit tests, nbval over all notebooks, book build with -W
# Both create the virtual environment if it is missing and make sure Fashion-MNIST is there.

SHELL := /bin/bash
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip -q --disable-pip-version-check
STAMP  := $(VENV)/.installed
# Notebooks run under the smoke profile in the tests (each <= 90 s on 2 cores).
TEST_PROFILE ?= smoke

.PHONY: book test venv data browser notebooks benchmark clean

venv: $(STAMP)

# Three install steps, in this order (see requirements.txt for why).
$(STAMP): requirements.txt requirements-common.txt requirements-mxnet.txt pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install --upgrade pip 2>&1 | grep -v "^WARNING: Location" || true
	$(PIP) install "$$(grep -E '^torch==' requirements.txt)" 2>&1 | grep -v "^WARNING: Location" || true
	$(PIP) install -r requirements.txt 2>&1 | grep -v "^WARNING: Location" || true
	$(PIP) install --no-deps -r requirements-mxnet.txt 2>&1 | grep -v "^WARNING: Location" || true
	$(PIP) install --no-deps --no-build-isolation -e . 2>&1 | grep -v -e "^WARNING: Location" -e BuildBackendWarning || true
	$(PY) -c "import torch, jax, flax, optax, paddle, d2lmini.mxnet, jupyter_book, nbval"
	touch $(STAMP)

# Fashion-MNIST: already verified somewhere (D2LMINI_DATA, cache, Debian) -> nothing to do;
# else Debian's package when apt-get can install it; else download from upstream.
data: $(STAMP)
	@$(PY) -m d2lmini data --no-download 2>/dev/null || { \
	  if command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ]; then \
	    apt-get install -y -q dataset-fashion-mnist >/dev/null 2>&1 || \
	    { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q dataset-fashion-mnist >/dev/null 2>&1; } || true; \
	  fi; \
	  $(PY) -m d2lmini data; }

# Debian's Chromium for the browser test (a browser a test tool downloads itself is not used).
browser:
	@command -v chromium >/dev/null || { \
	  if command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ]; then \
	    apt-get install -y -q chromium >/dev/null 2>&1 || \
	    { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q chromium >/dev/null 2>&1; }; \
	  fi; command -v chromium >/dev/null || echo "warning: no chromium; the browser test will be skipped (fails under CI)"; }

book: data
	$(VENV)/bin/jupyter-book build . --warningiserror --nitpick --keep-going
	@test -f _build/html/index.html && echo "book: $$(pwd)/_build/html/index.html"

test: data browser
	D2LMINI_PROFILE=$(TEST_PROFILE) $(PY) -m pytest

# Re-execute every notebook in place under the current profile (default: cpu without GPUs),
# refreshing the outputs stored in the repository.
notebooks: data
	$(PY) tools/execute_notebooks.py chapters

# Time the scratch and concise implementations on 1, 2 and 4 devices -> benchmarks/results.json
benchmark: data
	$(PY) tools/benchmark.py

clean:
	rm -rf _build
