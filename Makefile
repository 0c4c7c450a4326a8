# Developer entry points. `make test` is what CI runs (.ci/run).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# Stamp file: reinstall only when the dependency list changes.
STAMP := $(VENV)/.installed

.PHONY: venv test demo browser

venv: $(STAMP)

# torch is installed first and exactly: a bare `torch` requirement can resolve to the
# multi-GB CUDA build, while this pin lets pip take the local CPU wheel.
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install torch==2.13.0
	$(BIN)/python -m pip install -e '.[dev]'
	touch $(STAMP)

# Debian's Chromium, for rendering `plan --report` pages in tests/planner/export/test_report.py
# (about 45 s once, with apt-get update). Optional: without root, apt-get or Debian's packages
# it says so, and those tests skip.
browser:
	@command -v chromium >/dev/null || { command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ] \
		&& timeout 300 apt-get update -qq && DEBIAN_FRONTEND=noninteractive timeout 600 \
		apt-get install -y -qq --no-install-recommends chromium >/dev/null; } \
		|| echo "chromium not installed: the report's rendering tests will skip"

test: venv browser
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q --durations=15 tests

demo: venv
	$(BIN)/plan gpt3-175b --cluster dgx-a100-80g --gpus 1024 --global-batch-size 1536
	$(BIN)/plan check demo:mlp --mesh 4 --steps 3
	$(BIN)/plan check llama --num-layers 4 --hidden-size 64 --num-attention-heads 4 \
		--vocab-size 256 --seq-length 16 --gpus 8 --global-batch-size 16 \
		--tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 --steps 3
