# The two commands of the README:
#   make book   build the rendered book into _build/html (sets everything up first)
#   make test   run every test: unit tests, nbval over all notebooks, book build with -W
# Both create the virtual environment if it is missing and make sure Fashion-MNIST is there.
# GPU servers: one venv per framework (make gpu-venv FW=...), see the end of this file.

SHELL := /bin/bash
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip -q --disable-pip-version-check
STAMP  := $(VENV)/.installed
# Notebooks run under the smoke profile in the tests (each <= 90 s on 2 cores).
TEST_PROFILE ?= smoke
# The runs of every notebook in make test: k = 8 with the CPU capped at AVX2 (the first run, which
# also computes the cells that use one device whatever k is), then k = 1.
TEST_DEVICE_COUNTS ?= 8@avx2 1

.PHONY: book test check sweep lab venv data browser slurm notebooks benchmark clean gpu-venv gpu-check doctor rehearse

venv: $(STAMP)

# Three install steps, in this order (see requirements.txt for why).  An existing venv that
# holds a GPU build (CUDA torch, jax CUDA plugin, paddlepaddle-gpu, mxnet-cu*) is refused:
# these steps would replace it by the CPU builds.
$(STAMP): requirements.txt requirements-common.txt requirements-flax.txt requirements-mxnet.txt pyproject.toml
	@if test -x $(PY); then $(PY) -m tools.gpu_env cpu-venv-ok $(VENV); fi
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install --upgrade pip 2>&1 | grep -v "^WARNING: Location" || true
	$(PIP) install "$$(grep -E '^torch==' requirements.txt)" 2>&1 | grep -v "^WARNING: Location" || true
	$(PIP) install -r requirements.txt 2>&1 | grep -v "^WARNING: Location" || true
	$(PIP) install --no-deps -r requirements-mxnet.txt 2>&1 | grep -v "^WARNING: Location" || true
	$(PIP) install --no-deps --no-build-isolation -e . 2>&1 | grep -v -e "^WARNING: Location" -e BuildBackendWarning || true
	$(PY) -c "import torch, jax, flax, optax, paddle, d2lmini.mxnet, jupyter_book, nbval, jupyterlab"
	$(PY) -m ipykernel install --sys-prefix --name d2l --display-name "Python (d2l book)" >/dev/null
	touch $(STAMP)

# Fashion-MNIST: already verified somewhere (D2LMINI_DATA, cache, Debian) -> nothing to do;
# else Debian's package when apt-get can install it; else download from upstream.
# The GPT chapter's corpus (d2lmini/gpt/corpus.py): verified in the cache -> nothing to do;
# else `apt-get download r-cran-janeaustenr` (not installed), else Debian's mirror; decoded,
# its text verified by SHA-256.
data: $(STAMP)
	@$(PY) -m d2lmini data --no-download 2>/dev/null || { \
	  if command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ]; then \
	    apt-get install -y -q dataset-fashion-mnist >/dev/null 2>&1 || \
	    { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q dataset-fashion-mnist >/dev/null 2>&1; } || true; \
	  fi; \
	  $(PY) -m d2lmini data; }
	@$(PY) -m d2lmini corpus

# Debian's Chromium for the browser test (a browser a test tool downloads itself is not used).
browser:
	@command -v chromium >/dev/null || { \
	  if command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ]; then \
	    apt-get install -y -q chromium >/dev/null 2>&1 || \
	    { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q chromium >/dev/null 2>&1; }; \
	  fi; command -v chromium >/dev/null || echo "warning: no chromium; the browser test will be skipped (fails under CI)"; }

# Debian's Slurm and munge for the cluster test (tests/test_slurm.py starts two nodes here).
slurm:
	@{ test -x /usr/sbin/slurmd && test -x /usr/sbin/munged; } || { \
	  if command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ]; then \
	    apt-get install -y -q --no-install-recommends slurm-wlm munge >/dev/null 2>&1 || \
	    { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q --no-install-recommends slurm-wlm munge >/dev/null 2>&1; }; \
	  fi; { test -x /usr/sbin/slurmd && test -x /usr/sbin/munged; } || echo "warning: no slurm-wlm/munge; the cluster test will be skipped (fails under CI)"; }

book: data
	$(PY) -m tools.manifest --write-toc
	$(VENV)/bin/jupyter-book build . --warningiserror --nitpick --keep-going
	@test -f _build/html/index.html && echo "book: $$(pwd)/_build/html/index.html"

# Everything in one pytest run: the unit, fault, multi-node, JupyterLab, browser and book tests,
# and every notebook with 8 devices and with 1 (the 8-GPU node and the one-GPU workstation);
# the run at 8 has the CPU capped at AVX2 (8@avx2: oneDNN's and PyTorch's kernels,
# d2lmini.hardware.AVX2_CAPS), so that an AVX-512 machine checks the path an AVX2-only CPU
# takes (its own path is the stored outputs': `make notebooks` runs uncapped).  No run at the
# default count (2): it took a third of the notebooks' time and checks nothing k = 1 and 8 do
# not (docs/test-time.md); `make sweep` runs every count.  The run is spread
# over TEST_WORKERS (2) processes (pytest-xdist; the tests mostly wait on kernels, launched
# ranks and browsers).  conftest.py makes a
# notebook at one device count one unit of work, handed out longest first
# (tests/durations.json; `python -m tools.test_durations _build/test-results.xml` refreshes it from
# the last run).  TEST_WORKERS=0 runs everything in this process, one after the other.
TEST_WORKERS ?= 2
TEST_ARGS ?=
comma := ,
empty :=
space := $(empty) $(empty)
# d2lmini's bytecode is written first: where PYTHONDONTWRITEBYTECODE is set (as on this project's
# machines) every kernel and launched rank would otherwise compile d2lmini again (0.2 s each).
test: data browser slurm
	@mkdir -p _build
	@PYTHONDONTWRITEBYTECODE= $(PY) -m compileall -q d2lmini
	D2LMINI_PROFILE=$(TEST_PROFILE) $(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile \
	  --device-counts $(subst $(space),$(comma),$(strip $(TEST_DEVICE_COUNTS))) \
	  --junitxml=_build/test-results.xml --cpu-seconds=_build/cpu-seconds.json $(TEST_ARGS)

# The quick loop before a commit: the fast unit tests and nbval (k = 2) of the notebooks that
# changed since main's last commit, or of those named: make check NB="chapters/x/y.ipynb ...".
NB ?=
check: data
	@PYTHONDONTWRITEBYTECODE= $(PY) -m compileall -q d2lmini
	$(PY) -m tools.check $(NB)

# Every notebook with every device count from 1 to 8 (about an hour on 2 cores); the
# per-k summary lines go to _build/sweep.txt.
sweep: data
	@mkdir -p _build; : > _build/sweep.txt; rc=0; for k in 1 2 3 4 5 6 7 8; do \
	  echo "=== D2LMINI_NUM_DEVICES=$$k"; \
	  D2LMINI_PROFILE=$(TEST_PROFILE) D2LMINI_NUM_DEVICES=$$k $(PY) -m pytest -q chapters \
	    > _build/sweep-k$$k.log 2>&1 || rc=1; \
	  echo "k=$$k: $$(tail -1 _build/sweep-k$$k.log)" | tee -a _build/sweep.txt; \
	done; exit $$rc

# JupyterLab on 127.0.0.1:$(LAB_PORT) with a token, kernel "Python (d2l book)"; from another
# machine, tunnel: ssh -N -L $(LAB_PORT):127.0.0.1:$(LAB_PORT) <this host>  (tools/lab.py)
LAB_PORT ?= 8888
lab: data
	$(PY) -m tools.lab --port $(LAB_PORT)

# Re-execute every notebook in place under the current profile (default: cpu without GPUs),
# refreshing the outputs stored in the repository.
notebooks: data
	$(PY) -m tools.execute_notebooks chapters

# Rehearse a profile's training on this machine before a GPU sees it (default: the gpu profile
# with one device, as a one-GPU reader runs it): make rehearse NB="chapters/scratch/pytorch.ipynb"
# -> benchmarks/rehearsal/<chapter>-<notebook>.json, which tests/test_rehearsal.py holds the
# profile to.  Up to an hour a notebook on 2 cores.
REHEARSE_ARGS ?=
rehearse: data
	@test -n "$(NB)" || { echo 'usage: make rehearse NB="chapters/scratch/pytorch.ipynb ..."' >&2; exit 2; }
	$(PY) -m tools.rehearse $(REHEARSE_ARGS) $(NB)

# Time the scratch and concise implementations on 1, 2 and 4 devices -> benchmarks/results.json
benchmark: data
	$(PY) -m tools.benchmark

clean:
	rm -rf _build

# --- GPU servers: one venv per framework ------------------------------------------------------
# The frameworks' CUDA builds pin different cuDNN/NCCL versions exactly, so they cannot share
# one environment: `make gpu-venv FW=torch` creates .venv-gpu-torch with the PyTorch GPU build,
# the shared pins and d2lmini, and registers the Jupyter kernel d2l-gpu-torch.  The CPU targets
# above never touch these venvs.  The pip steps are those of d2lmini/hardware.py (GPU_BUILDS),
# which the doctor prints as fixes (tests/test_doctor.py checks that the two agree).
FW           ?=
GPU_FRAMEWORKS := torch jax paddle mxnet
GPU_VENV     := .venv-gpu-$(FW)
GPU_PY       := $(GPU_VENV)/bin/python
GPU_PIP      := $(GPU_PY) -m pip --disable-pip-version-check
PADDLE_INDEX ?= https://www.paddlepaddle.org.cn/packages/stable/cu126/
# --user: the kernels are visible to every Jupyter of this user (JupyterLab, VS Code, ...);
# KERNEL_SCOPE=--sys-prefix keeps a kernel inside its venv (seen only by that venv's Jupyter).
KERNEL_SCOPE ?= --user
GPU_STEPS_torch  := "-r requirements-gpu-torch.txt"
GPU_STEPS_jax    := "-r requirements-gpu-jax.txt"
GPU_STEPS_paddle := "-r requirements-gpu-paddle.txt --extra-index-url $(PADDLE_INDEX)"
GPU_STEPS_mxnet  := "-r requirements-common.txt" "--no-deps -r requirements-gpu-mxnet.txt"
GPU_KERNEL_torch  := Python (d2l, PyTorch GPU)
GPU_KERNEL_jax    := Python (d2l, JAX GPU)
GPU_KERNEL_paddle := Python (d2l, PaddlePaddle GPU)
GPU_KERNEL_mxnet  := Python (d2l, MXNet GPU)

gpu-venv:
	@case " $(GPU_FRAMEWORKS) " in *" $(FW) "*) ;; \
	  *) echo "usage: make gpu-venv FW=<torch|jax|paddle|mxnet>" >&2; exit 2;; esac
	test -x $(GPU_PY) || $(PYTHON) -m venv $(GPU_VENV)
	$(GPU_PIP) install -q --upgrade pip
	for step in $(GPU_STEPS_$(FW)); do $(GPU_PIP) install $$step || exit 1; done
	$(GPU_PIP) install --no-deps -e .
	$(GPU_PY) -m ipykernel install $(KERNEL_SCOPE) --name d2l-gpu-$(FW) --display-name "$(GPU_KERNEL_$(FW))"
	-$(GPU_PY) -m d2lmini doctor -f $(FW) --require $(FW)

# Resolve every GPU environment with pip --dry-run (installs nothing); Paddle only where its
# index is reachable.
gpu-check:
	@py=$(PY); test -x $$py || py=$(PYTHON); $$py -m tools.gpu_env check

# The doctor in every venv that exists: what each framework sees, what is wrong, the fixes.
doctor:
	@rc=0; for v in $(VENV) .venv-gpu-*; do \
	  test -x $$v/bin/python || continue; echo "=== $$v"; \
	  $$v/bin/python -m d2lmini doctor || rc=1; echo; done; exit $$rc

# --- The step benchmark: every framework's step, timed the same way (d2lmini.steptime) ----------
# On a GPU machine: the fast-path ladder, the step's shape T0 + B t, the epoch span and the
# card's TF32/bf16 peaks, each framework in its own process (PyTorch and JAX at batches
# 32,128,256: 165 s on one H200, 2026-11-27).  Without a GPU: STEP_BENCH_ARGS="--allow-cpu --quick".
# Then the GPT chapter's step (tools/gpt_bench.py): tokens/s, MFU and peak memory at GPT-2
# small shapes (16 x 1,024 tokens), float32 and bf16 (+ torch.compile), unconfirmed on GPU.
# Without a GPU: GPT_BENCH_ARGS="--allow-cpu --quick".
STEP_BENCH_ARGS ?=
STEP_BENCH_OUT ?= benchmarks/gpu-bench/steps.json
GPT_BENCH_ARGS ?= --profile gpu
GPT_BENCH_OUT ?= benchmarks/gpu-bench/gpt.json
.PHONY: gpu-bench
gpu-bench:
	@py="$(PY)"; command -v "$$py" >/dev/null || py="$(PYTHON)"; rc=0; \
	  $$py -m tools.step_bench --out $(STEP_BENCH_OUT) $(STEP_BENCH_ARGS) || rc=1; \
	  $$py -m tools.gpt_bench --out $(GPT_BENCH_OUT) $(GPT_BENCH_ARGS) || rc=1; exit $$rc

# --- A GPU server without network: run what can run, write a report --------------------------
# Any interpreter that holds the frameworks' GPU builds (and d2lmini, or nothing: the tool puts
# the checkout on PYTHONPATH): `make gpu-run PY=python3`.  Three runs of the notebooks of every
# framework it can import (nbval where pytest+nbval+ipykernel are there, else the code cells),
# each from a private copy of the checkout: smoke profile with 1 device, smoke with 8 (stand-ins
# where there are fewer GPUs), both over every chapter, and the gpu profile on every GPU for
# the devices, scratch and concise chapters (PyTorch and JAX: 6/6 passed on one H200,
# 2026-11-27, 313 s with the two frameworks side by side) followed by the benchmark.
# Reports: $(GPU_RUN_OUT)/{smoke-k1,smoke-k8,gpu-profile}/gpu-report.{json,md} (+ results-gpu.json).
# More options for all three: GPU_RUN_ARGS="--frameworks torch,jax --chapters devices".
.PHONY: gpu-run
GPU_RUN_ARGS ?=
GPU_RUN_OUT ?= benchmarks/gpu-run
gpu-run:
	@py="$(PY)"; command -v "$$py" >/dev/null || py="$(PYTHON)"; rc=0; \
	  $$py -m tools.gpu_run --profile smoke --devices 1 --skip-benchmark \
	    --out-dir $(GPU_RUN_OUT)/smoke-k1 $(GPU_RUN_ARGS) || rc=1; \
	  $$py -m tools.gpu_run --profile smoke --devices 8 --skip-benchmark \
	    --out-dir $(GPU_RUN_OUT)/smoke-k8 $(GPU_RUN_ARGS) || rc=1; \
	  $$py -m tools.gpu_run --profile gpu --chapters devices,scratch,concise \
	    --out-dir $(GPU_RUN_OUT)/gpu-profile $(GPU_RUN_ARGS) || rc=1; exit $$rc
