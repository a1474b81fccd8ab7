# Two commands set everything up on a fresh machine:  `make demo`  and  `make test`.
PYTHON  ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
PROFILE ?= gemma
ARGS    ?=

.PHONY: install models bundle system-packages demo test pi-check lint docs bench router reader calibrate clean

install: $(VENV)/.installed

# llama-cpp-python compiles from source (~6 min on 2 cores), once per build flags: the wheel is kept in $(WHEELS).
# On x86-64 it is built for the AVX2 (Haswell) baseline, not -march=native: a native build on a Sapphire Rapids
# host compiles in AMX tile kernels that crash (SIGSEGV at ldtilecfg in ggml_backend_amx_mul_mat) where the
# hypervisor does not grant AMX state, and a native wheel would not run on an older kiosk CPU. Elsewhere
# (aarch64: Pi, Jetson) the native build is the right one. pip's own wheel cache ignores CMAKE_ARGS, hence our own.
LLAMA_VERSION := 0.3.36
ifeq ($(shell uname -m),x86_64)
LLAMA_CMAKE_ARGS ?= -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON
endif
WHEELS ?= $(HOME)/.cache/edge-rag/wheels/llama-$(shell echo '$(LLAMA_VERSION) $(LLAMA_CMAKE_ARGS)' | sha1sum | cut -c1-12)

$(WHEELS)/.built:
	mkdir -p $(WHEELS)
	CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" $(PYTHON) -m pip wheel -q --no-deps --no-cache-dir -w $(WHEELS) \
		llama-cpp-python==$(LLAMA_VERSION)
	touch $@

# Extras: convert (torch CPU 2.13.0, transformers, onnx, gguf) builds the bundle; bench, dev and docs for the rest.
$(VENV)/.installed: pyproject.toml $(WHEELS)/.built
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q --no-deps --force-reinstall $(WHEELS)/llama_cpp_python-$(LLAMA_VERSION)-*.whl
	$(BIN)/pip install -q -e '.[convert,bench,dev,serve,ingest,docs]'
	touch $@

models: install
	$(BIN)/edge-rag models pull --profile $(PROFILE)

# Host builds, device installs: one archive; on the device `pip install edge-rag` (no torch) and
# `edge-rag models install edge-rag-$(PROFILE).tar`.
bundle: models
	$(BIN)/python -m convert bundle --profile $(PROFILE) --archive dist/edge-rag-$(PROFILE).tar

# System packages the suite uses, installed with one `apt-get update` when missing (root + apt only):
# qemu-user (the encoder verified under `qemu-x86_64 -cpu Haswell`: AVX2 only, no AVX-512/VNNI) and Debian's
# chromium (the kiosk page driven through Playwright, no browser download). Without them those tests skip and say so.
SYSTEM_PACKAGES := $(if $(shell command -v qemu-x86_64),,qemu-user) $(if $(shell command -v chromium),,chromium)
# The aarch64 check (tests/test_aarch64.py, make pi-check): an arm64 Debian root from debootstrap, and Debian's
# cross compiler for the two dependencies PyPI has no aarch64 wheel of (hnswlib, llama-cpp-python).
SYSTEM_PACKAGES += $(if $(shell command -v debootstrap),,debootstrap) \
	$(if $(shell command -v aarch64-linux-gnu-g++),,g++-aarch64-linux-gnu)
system-packages:
	@[ -z "$(strip $(SYSTEM_PACKAGES))" ] || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(SYSTEM_PACKAGES) >/dev/null; } \
	      || echo "could not install $(strip $(SYSTEM_PACKAGES)): the tests that need them will be skipped"; \
	  else echo "$(strip $(SYSTEM_PACKAGES)) missing and not root: the tests that need them will be skipped"; fi; }

demo: models
	$(BIN)/edge-rag demo --profile $(PROFILE)

test: models system-packages
	EDGE_RAG_WHEELS=$(WHEELS) $(BIN)/python tests/isolated.py $(ARGS)

# The device side on an emulated Raspberry Pi / Jetson CPU (qemu-aarch64), installed from the bundle archive:
# encoder and reader int8 on ARM kernels, the demo answers against x86, a GPT-route answer, torch-free tests.
# Builds cached in ~/.cache/edge-rag/aarch64 (llama-cpp-python cross-compiled once, ~11 min); report in pi-check/.
pi-check: bundle system-packages
	$(BIN)/python -m benchmarks.pi_check --archive dist/edge-rag-$(PROFILE).tar $(ARGS)

# Benchmarks: quick (100 questions per dataset) or FULL=1 (all); extra options via ARGS="--threads 2 ...".
# BENCH_OUT: the one folder all three write (the site renders another with EDGE_RAG_BENCH_RESULTS=BENCH_OUT).
BENCH_OUT ?= bench-results
bench: models
	$(BIN)/python -m benchmarks $(if $(FULL),--full) --profile $(PROFILE) --out $(BENCH_OUT) $(ARGS)
	$(BIN)/python -m benchmarks.load --profile $(PROFILE) --out $(BENCH_OUT)/load.json
	$(BIN)/python -m benchmarks.own_calibration --profile $(PROFILE) --out $(BENCH_OUT)/own_calibration

# Re-train the shipped router (edge_rag/assets/router.onnx) from ../shared/data; labels are cached.
router: models
	$(BIN)/python -m convert train-router $(ARGS)

# Re-fit the answer score on reader-val and re-certify its thresholds on the calibration split
# (edge_rag/assets/calibration.json + calibration_report.md); run after the reader or the pipeline changes.
# Both shipped calibrations: the embedded store's, and a PostgreSQL store's (its full-text half ranks by ts_rank_cd, so
# its decisions are counted on a throw-away pgvector server of its own; edge_rag/assets/calibration-pgvector.json).
calibrate: models
	$(BIN)/python -m convert calibrate $(ARGS)
	$(BIN)/python -m convert calibrate --backend pgvector $(ARGS)

# Re-train the extractive reader (edge_rag/assets/reader.onnx, int8) and its report; seeded. This is the first stage;
# the shipped reader adds a second one on windows it did not see (README "The extractive reader").
reader: models
	$(BIN)/python -m convert train-reader $(ARGS)

lint: install
	$(BIN)/ruff check edge_rag convert benchmarks evaluation tests docs
	$(BIN)/mypy

# The documentation site into site/ (mkdocs.yml). Strict: a broken link or anchor, or a Config field, CLI option or
# HTTP route without a description, fails. The reference pages and result tables are generated (docs/hooks.py, docs/reference_gen.py).
docs: install
	$(BIN)/mkdocs build --strict

clean:
	rm -rf $(VENV) build dist site *.egg-info tests/.cache tests/.artifacts
