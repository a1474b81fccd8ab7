# Two commands set everything up on a fresh machine:  `make demo`  and  `make test`.
PYTHON  ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
PROFILE ?= gemma
ARGS    ?=

.PHONY: install models bundle qemu demo test lint bench router clean

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

# Host builds, device installs: one archive; on the device `pip install edge-rag` (no torch) and
# `edge-rag models install edge-rag-$(PROFILE).tar`.
bundle: models
	$(BIN)/python -m convert bundle --profile $(PROFILE) --archive dist/edge-rag-$(PROFILE).tar

# The suite also verifies the encoder under `qemu-x86_64 -cpu Haswell` (AVX2 only, no AVX-512/VNNI).
qemu:
	@command -v qemu-x86_64 >/dev/null || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq qemu-user >/dev/null; \
	  else echo "qemu-user missing and not root: the emulated AVX2-only encoder check will be skipped"; fi; }

demo: models
	$(BIN)/edge-rag demo --profile $(PROFILE)

test: models qemu
	$(BIN)/python -m pytest $(ARGS)

# Benchmarks: quick (100 questions per dataset) or FULL=1 (all); extra options via ARGS="--threads 2 ...".
bench: models
	$(BIN)/python -m benchmarks $(if $(FULL),--full) --profile $(PROFILE) $(ARGS)

# Re-train the shipped router (edge_rag/assets/router.onnx) from ../shared/data; labels are cached.
router: models
	$(BIN)/python -m convert train-router $(ARGS)

lint: install
	$(BIN)/ruff check edge_rag convert benchmarks tests

clean:
	rm -rf $(VENV) build dist *.egg-info tests/.cache
