# The two commands of README.md: `make demo` (the main job) and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install demo test lint bench clean

# torch is pinned here, before the package, so pip takes the local CPU wheel; pyproject keeps a
# range (torch>=2.6) for users.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[dev,data,bench]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/attnzoo demo

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/ruff format --check src tests benchmarks

test: $(STAMP) lint
	$(BIN)/pytest -q -n 2 --durations=15

# every benchmark, then the docs tables from their JSON (long: see docs/ for each one's budget)
bench: $(STAMP)
	$(BIN)/python benchmarks/bench_attention.py
	$(BIN)/python benchmarks/bench_overhead.py
	$(BIN)/python benchmarks/bench_seq2seq_throughput.py
	$(BIN)/python benchmarks/bench_seq2seq.py
	$(BIN)/python benchmarks/bench_keras.py
	$(BIN)/python benchmarks/bench_transformer.py
	$(BIN)/python benchmarks/report.py

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info .pytest_cache .ruff_cache
