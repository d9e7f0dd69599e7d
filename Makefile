# The two commands: `make devnet` and `make test`. Both create .venv if missing.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: venv test lint devnet bench bench-quick vectors soak proto clean cometbft

# CometBFT, built from source at a pinned version (never a downloaded binary) into a project-local
# folder named after the version: a second `make` finds the file and builds nothing, and changing
# the pin builds the new one. chain/abci/cometbft.py's COMETBFT_VERSION must say the same. Only
# `--engine cometbft` uses it: `make devnet` does not build it (the devnet builds it on first use,
# with the same `go install`, saying so); `make test` does, since tests run CometBFT validators.
COMETBFT_VERSION := v0.38.26
COMETBFT := .tools/cometbft-$(COMETBFT_VERSION)/bin/cometbft

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# torch first and pinned to the version every determinism figure was measured with. PyPI's
	# 2.13.0 wheel is the CUDA build with its NVIDIA libraries (the venv is ~5 GB); it runs on a CPU
	# as well. pyproject's torch>=2.4 is then satisfied.
	@echo "installing torch 2.13.0 (PyPI's CUDA wheel with the NVIDIA libraries: ~5 GB, minutes on a fresh machine)"
	$(BIN)/pip install -q torch==2.13.0 numpy
	@echo "installing gonka-diloco and its dependencies (transformers, cosmpy, fastapi, ...)"
	$(BIN)/pip install -q -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP)

lint: $(STAMP)
	$(BIN)/ruff check .

$(COMETBFT):
	GOBIN=$(CURDIR)/$(dir $(COMETBFT)) go install github.com/cometbft/cometbft/cmd/cometbft@$(COMETBFT_VERSION)

cometbft: $(COMETBFT)

# The suite's tests pin torch to one thread and mostly wait on one process each, so serially it
# keeps one core of two busy (94% of one core, 822 s); two pytest-xdist workers use both (487 s).
# `worksteal` because a few end-to-end tests take 30-60 s and the rest well under a second.
TEST_WORKERS ?= 2

test: $(STAMP) $(COMETBFT)
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist worksteal

devnet: $(STAMP)
	$(BIN)/gonka-diloco devnet $(ARGS)

bench-quick: $(STAMP)
	# torchft (the DiLoCo reference of bench.convergence) with torch pinned: never a CUDA build.
	$(BIN)/python -c "import torchft" 2>/dev/null || $(BIN)/pip install -q torch==2.13.0 -e '.[bench]'
	$(BIN)/python -m bench --quick

bench: $(STAMP) $(COMETBFT)
	# torchft (the DiLoCo reference of bench.convergence) with torch pinned: never a CUDA build.
	$(BIN)/python -c "import torchft" 2>/dev/null || $(BIN)/pip install -q torch==2.13.0 -e '.[bench]'
	$(BIN)/python -m bench

soak: $(STAMP) $(COMETBFT)
	$(BIN)/python -m bench.soak $(ARGS)

vectors: $(STAMP)
	$(BIN)/python -m specs.make_vectors

proto: $(STAMP)
	$(BIN)/python -m protocol.proto.build

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .mypy_cache
	# .tools (the CometBFT build) stays: rebuilding it costs minutes; `rm -rf .tools` if you mean it
