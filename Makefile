# One command each, on a fresh machine:  make demo   |   make test   |   make bench
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# A CPU build of torch that satisfies dpro's torch>=2.3; set TORCH_SPEC to use another.
TORCH_SPEC ?= torch==2.13.0

.PHONY: setup demo test test-fast bench clean

$(BIN)/dpro: pyproject.toml
	# the headless browser the tests open the HTML reports in
	command -v chromedriver >/dev/null || (apt-get update -qq && apt-get install -y -qq chromium chromium-driver)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet "$(TORCH_SPEC)"
	$(BIN)/pip install --quiet -e '.[test]'
	touch $@

setup: $(BIN)/dpro

demo: setup
	$(BIN)/dpro demo

test: setup
	$(BIN)/pytest -q --durations=40

test-fast: setup
	$(BIN)/pytest -q -m "not slow"

bench: setup
	$(BIN)/python -m benchmarks

clean:
	rm -rf $(VENV) dpro-demo-* dpro-run-*
