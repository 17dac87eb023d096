# The README's two commands: `make demo` (the main job) and `make test` (the suite).
# Each sets itself up on a fresh machine: a virtual environment in .venv, the
# pinned CPU build of torch first (an unpinned torch pulls a multi-GB CUDA
# build), then this project in editable mode, which compiles the Cython code.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.fleetfeed-installed
# Every .pyx/.pxd of the three packages, at any depth.
CYTHON_SOURCES := $(shell find datafeed generators trainer -name '*.pyx' -o -name '*.pxd')
SOURCES := setup.py pyproject.toml $(CYTHON_SOURCES)
# The linters `make lint` runs, pinned: a new release's new rules must not fail CI.
LINTERS := ruff==0.17.6 cython-lint==0.22.1
CYTHON_FILES := $(sort $(CYTHON_SOURCES))

.PHONY: all install build demo lint test test-repeat test-pythons smoke-oldest bench bench-paddle bench-paddle-ps bench-ps record-paddle-fixtures clean

all: test

$(STAMP): $(SOURCES)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet "setuptools>=68" "Cython>=3.0" wheel
	$(PY) -m pip install --quiet --no-build-isolation -e ".[test]"
	touch $(STAMP)

# The linters in the default venv only (cython-lint 0.22.1 is not published for
# Python 3.10; the venvs of the other Pythons run the tests alone).
LINT_STAMP := $(VENV)/.linters-installed
$(LINT_STAMP): $(STAMP)
	$(PY) -m pip install --quiet $(LINTERS)
	touch $(LINT_STAMP)

install: $(STAMP)

# Rebuild the extensions in place after editing a .pyx.
build: $(STAMP)
	$(PY) setup.py --quiet build_ext --inplace

demo: $(STAMP)
	$(PY) examples/demo.py

# ruff for the Python code, cython-lint for the .pyx/.pxd (settings in
# pyproject.toml). cython-lint runs pycodestyle by name: the venv's bin goes first on PATH.
lint: $(LINT_STAMP)
	$(VENV)/bin/ruff check .
	PATH="$(abspath $(VENV))/bin:$$PATH" $(VENV)/bin/cython-lint $(CYTHON_FILES)

# Two pytest workers (pytest-xdist), each taking whole test files (module
# fixtures such as test_ps_servers.py's jobs run once): most tests wait on
# subprocesses, so two workers finish well before one even on a 2-core machine
# (benchmarks/suite_rounds.py --workers 0 measures the serial run; its results
# are in benchmarks/results/). PYTEST_WORKERS=0 runs it in one process.
PYTEST_WORKERS ?= 2
PARALLEL := $(if $(filter 0,$(PYTEST_WORKERS)),,-n $(PYTEST_WORKERS) --dist loadfile)

# -p no:randomly: pytest-randomly (in the test extra) would shuffle the order
# and reseed random/numpy per test; `make test` keeps the files' order.
test: $(STAMP)
	$(PY) -m pytest -q -p no:randomly $(PARALLEL)

# The suite N times (default 5), each round in another random order (pytest-randomly,
# seeded: SEED=<n> replays a run's orders), to find tests that depend on order or
# flake. One pytest process per round, so the session fixtures are new each time;
# the first failing round stops it and says how to replay it. Extra pytest
# arguments in ARGS (e.g. ARGS='-m "not slow" tests/trainer'); one test many times
# in one process: ARGS='--count 50 tests/...::test_x' (pytest-repeat).
N ?= 5
SEED ?= $(shell date +%s)
test-repeat: $(STAMP)
	@for round in $$(seq $(N)); do \
	  seed=$$(( $(SEED) + round - 1 )); \
	  echo "== round $$round of $(N): --randomly-seed=$$seed"; \
	  $(PY) -m pytest -q $(PARALLEL) --randomly-seed=$$seed $(ARGS) || \
	  { echo "== round $$round failed: replay with make test-repeat N=1 SEED=$$seed"; exit 1; }; \
	done

# The suite on every supported Python that is installed here, each in its own
# venv (.venv-3.10, ...). An interpreter is found on PATH as python3.X, else
# among pyenv's versions. Torch: the pinned 2.13.0, whichever build pip finds
# for that Python (the CPU build on this disk is for 3.11 only; others take
# PyPI's, several GB the first time).
SUPPORTED_PYTHONS := 3.10 3.11 3.12 3.13
find_python = $(firstword $(shell command -v python$(1) >/dev/null 2>&1 && python$(1) -c 1 >/dev/null 2>&1 && command -v python$(1)) $(wildcard $(or $(PYENV_ROOT),$(HOME)/.pyenv)/versions/$(1).*/bin/python$(1)))
test-pythons:
	@$(foreach v,$(SUPPORTED_PYTHONS),$(if $(call find_python,$(v)),\
	  echo "== Python $(v): $(call find_python,$(v))" && \
	  $(MAKE) --no-print-directory test PYTHON=$(call find_python,$(v)) VENV=.venv-$(v) &&,\
	  echo "== Python $(v): not installed, skipped" &&)) true

# A fast check of the oldest supported Python, for CI: the engine's torch-free
# tests (parser, cache, the datafeed command, child processes) in a venv without
# torch, the extensions compiled for that interpreter. Skipped if it is absent.
OLDEST_PYTHON := $(firstword $(SUPPORTED_PYTHONS))
SMOKE_VENV := .venv-smoke-$(OLDEST_PYTHON)
SMOKE_TESTS := $(addprefix tests/datafeed/,test_parse.py test_cache.py test_cli.py test_process.py test_gather.py)
smoke-oldest:
	@py=$(call find_python,$(OLDEST_PYTHON)); \
	if [ -z "$$py" ]; then echo "== Python $(OLDEST_PYTHON): not installed, smoke skipped"; exit 0; fi; \
	echo "== smoke of Python $(OLDEST_PYTHON): $$py"; \
	set -e; test -x $(SMOKE_VENV)/bin/python || $$py -m venv $(SMOKE_VENV); \
	$(SMOKE_VENV)/bin/python -m pip install --quiet "setuptools>=68" "Cython>=3.0" wheel \
	  "numpy>=1.24" "pyarrow>=14" "multiprocess>=0.70" "tqdm>=4.60" "pytest>=7.4" "hypothesis>=6.80"; \
	$(SMOKE_VENV)/bin/python -m pip install --quiet --no-build-isolation --no-deps -e .; \
	$(SMOKE_VENV)/bin/python -m pytest -q -p no:cacheprovider $(SMOKE_TESTS)

# Benchmarks are not tests: they print figures and write benchmarks/RESULTS.md.
# Paddle runs in its own virtual environment (it pins its own numpy/protobuf).
PADDLE_VENV ?= .venv-paddle
$(PADDLE_VENV)/.installed:
	$(PYTHON) -m venv $(PADDLE_VENV)
	$(PADDLE_VENV)/bin/pip install --quiet paddlepaddle==3.3.1
	touch $@

bench-paddle: $(PADDLE_VENV)/.installed

# Paddle 3.3.1's own generator output, which tests/generators compares fleetfeed
# with on every run: re-record after changing tests/helpers/paddle_generator_cases.py
# (tests/data/paddle_generators/README.md).
record-paddle-fixtures: $(PADDLE_VENV)/.installed
	$(PADDLE_VENV)/bin/python tests/generators/record_paddle_fixtures.py

# Paddle's parameter server, for benchmarks/bench_ps.py: the registry's CPU builds
# from 3.1 on lack its runtime (no DistFleetWrapper); 3.0.0 has it and needs protobuf<6.
PADDLE_PS_VENV ?= .venv-paddle30
$(PADDLE_PS_VENV)/.installed:
	$(PYTHON) -m venv $(PADDLE_PS_VENV)
	$(PADDLE_PS_VENV)/bin/pip install --quiet paddlepaddle==3.0.0 "protobuf<6"
	touch $@

bench-paddle-ps: $(PADDLE_PS_VENV)/.installed

# fleetfeed's PS and Paddle 3.0.0's side by side: benchmarks/results/ps.md.
bench-ps: $(STAMP) $(PADDLE_PS_VENV)/.installed
	$(PY) benchmarks/bench_ps.py --paddle --paddle-python $(PADDLE_PS_VENV)/bin/python --repeats 3
	$(PY) benchmarks/quote_results.py

# Each script replaces its own section of benchmarks/RESULTS.md.
PADDLE_PY = $(if $(wildcard $(PADDLE_VENV)/bin/python),$(PADDLE_VENV)/bin/python,none)
bench: $(STAMP)
	$(PY) benchmarks/run_engine.py --paddle-python $(PADDLE_PY)
	$(PY) benchmarks/bench_speed.py
	$(PY) benchmarks/bench_generator.py --paddle-python $(PADDLE_PY)
	$(PY) benchmarks/fuzz_parser.py
	$(PY) benchmarks/soak.py
	$(PY) benchmarks/faults.py
	$(PY) benchmarks/bench_global_shuffle.py
	$(PY) benchmarks/quote_results.py

clean:
	rm -rf build *.egg-info
	find datafeed generators trainer \( -name '*.c' -o -name '*.so' \) -delete
