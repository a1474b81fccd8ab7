# Two commands set everything up on a fresh machine:  `make demo`  and  `make test`.
PYTHON  ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
PROFILE ?= gemma
ARGS    ?=

.PHONY: install models demo test lint bench router reader calibrate clean

install: $(VENV)/.installed

# Extras: convert (torch CPU 2.13.0, transformers, onnx, gguf) builds the bundle; bench and dev for the rest.
# llama-cpp-python compiles from source once (~6 min on 2 cores); pip caches the wheel afterwards.
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[convert,bench,dev]'
	touch $@

models: install
	$(BIN)/edge-rag models pull --profile $(PROFILE)

demo: models
	$(BIN)/edge-rag demo --profile $(PROFILE)

test: models
	$(BIN)/python -m pytest $(ARGS)

# Benchmarks: quick (100 questions per dataset) or FULL=1 (all); extra options via ARGS="--threads 2 ...".
bench: models
	$(BIN)/python -m benchmarks $(if $(FULL),--full) --profile $(PROFILE) $(ARGS)

# Re-train the shipped router (edge_rag/assets/router.onnx) from ../shared/data; labels are cached.
router: models
	$(BIN)/python -m convert train-router $(ARGS)

# Re-fit the answer score on reader-val and re-certify its thresholds on the calibration split
# (edge_rag/assets/calibration.json + calibration_report.md); run after the reader or the pipeline changes.
calibrate: models
	$(BIN)/python -m convert calibrate $(ARGS)

# Re-train the shipped extractive reader (edge_rag/assets/reader.onnx, int8) and its report; seeded.
reader: models
	$(BIN)/python -m convert train-reader $(ARGS)

lint: install
	$(BIN)/ruff check edge_rag convert benchmarks tests

clean:
	rm -rf $(VENV) build dist *.egg-info tests/.cache
