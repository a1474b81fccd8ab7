# Two commands set everything up on a fresh machine:  `make demo`  and  `make test`.
PYTHON  ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
PROFILE ?= gemma
ARGS    ?=

.PHONY: install models demo test chromium lint bench router clean

install: $(VENV)/.installed

# Extras: convert (torch CPU 2.13.0, transformers, onnx, gguf) builds the bundle; bench and dev for the rest.
# llama-cpp-python compiles from source once (~6 min on 2 cores); pip caches the wheel afterwards.
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[convert,bench,dev,serve,ingest]'
	touch $@

models: install
	$(BIN)/edge-rag models pull --profile $(PROFILE)

demo: models
	$(BIN)/edge-rag demo --profile $(PROFILE)

test: models chromium
	$(BIN)/python -m pytest $(ARGS)

# The kiosk page test drives Debian's chromium through Playwright (no browser download); where it cannot
# be installed (not root, no apt) the test skips and says so.
chromium:
	@command -v chromium >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; } || \
		echo "chromium could not be installed (needs root and apt-get): the browser test will be skipped"

# Benchmarks: quick (100 questions per dataset) or FULL=1 (all); extra options via ARGS="--threads 2 ...".
bench: models
	$(BIN)/python -m benchmarks $(if $(FULL),--full) --profile $(PROFILE) $(ARGS)
	$(BIN)/python -m benchmarks.load --profile $(PROFILE)

# Re-train the shipped router (edge_rag/assets/router.onnx) from ../shared/data; labels are cached.
router: models
	$(BIN)/python -m convert train-router $(ARGS)

lint: install
	$(BIN)/ruff check edge_rag convert benchmarks tests

clean:
	rm -rf $(VENV) build dist *.egg-info tests/.cache tests/.artifacts
