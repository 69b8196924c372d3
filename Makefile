# Two commands for a fresh machine: `make demo` and `make test`.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.PHONY: demo test test-services lint format bench bench-random bench-write bench-compressed bench-remote bench-remote-peers bench-peers bench-convert fuzz clean

$(STAMP): pyproject.toml requirements-dev.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check -r requirements-dev.txt
	$(BIN)/pip install --quiet --disable-pip-version-check -e ".[dev]"
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/python examples/demo.py

# Two workers (CI has two cores), each given whole test files (--dist loadfile), so a file's
# module fixtures are built once; files go out in the order conftest.py sorts them, longest
# first (--no-loadscope-reorder keeps that order), so no long file starts last.
# `make test PYTEST_WORKERS=0` runs in one process.
PYTEST_WORKERS ?= 2

test: $(STAMP) test-services
	$(BIN)/python -m pytest -q -n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=25

# Debian's nginx, for tests/test_http.py (a web server without directory listing, as a CDN);
# the tests start their own, on a free port. Installed once (CI runs as root).
test-services:
	command -v nginx >/dev/null || test -x /usr/sbin/nginx || \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nginx-light)

# Style, types (mypy --strict on src/) and architecture (import-linter contracts in pyproject.toml).
lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks examples fuzz tools
	$(BIN)/ruff format --check src tests benchmarks examples fuzz tools
	$(BIN)/mypy
	$(BIN)/lint-imports --no-cache
	$(BIN)/python tools/check_modules.py

format: $(STAMP)
	$(BIN)/ruff format src tests benchmarks examples
	$(BIN)/ruff check --fix src tests benchmarks examples

bench: $(STAMP)
	$(BIN)/python benchmarks/bench.py

# Random access (ds[i], get_batch, DataLoader) side by side with ArrayRecord.
# Parquet -> superserial against pyarrow + save, HF against to_tf_dataset + save, and peak RSS on > 2 GB of Parquet.
bench-convert: $(STAMP)
	$(BIN)/python benchmarks/convert.py

bench-random: $(STAMP)
	$(BIN)/python benchmarks/random_access.py

# The three write paths (save; save with shard_index + finalize; Writer + finalize) side by side.
bench-write: $(STAMP)
	$(BIN)/python benchmarks/write_paths.py

# Compressed datasets (issue 24): the restart spacing study, then GZIP size, random reads,
# shuffle and save side by side with TF's GZIP writer and ArrayRecord (zstd).
bench-compressed: $(STAMP)
	$(BIN)/python benchmarks/compressed_spacing.py
	$(BIN)/python benchmarks/compressed.py

# Remote reads (issue 23): every reader over moto and nginx behind a 0/20/50 ms proxy, against
# plain-client ceilings and the peers (about 20 min on 2 cores; `--quick` for a smoke run).
# The peers (mosaicml-streaming, litdata) run from a venv of their own, made by
# bench-remote-peers: they would change the dev venv's numpy and torch.
PEER_VENV ?= .venv-peers
bench-remote: $(STAMP) test-services
	$(BIN)/python benchmarks/remote.py --peer-python $(PEER_VENV)/bin/python \
		--json benchmarks/out/remote.json

bench-remote-peers:
	test -x $(PEER_VENV)/bin/python || $(PYTHON) -m venv $(PEER_VENV)
	$(PEER_VENV)/bin/pip install --quiet --disable-pip-version-check -r benchmarks/requirements-peers.txt

# The README's table (issue 26): bench.py with the peer rows of benchmarks/peers.py (Lance,
# HF datasets, mosaicml-streaming, litdata on local files; the peers from PEER_VENV).
bench-peers: $(STAMP) bench-remote-peers
	$(BIN)/python benchmarks/bench.py --peers $(PEER_VENV)/bin/python

# Longer fuzzing than the suite does (atheris, 5 minutes per target); see docs/reliability.md.
fuzz: $(STAMP)
	$(BIN)/pip install --quiet --disable-pip-version-check atheris
	$(BIN)/python fuzz/make_corpus.py
	mkdir -p /tmp/superserial-fuzz/header /tmp/superserial-fuzz/records
	$(BIN)/python fuzz/fuzz_header.py -dict=fuzz/header.dict -max_total_time=300 /tmp/superserial-fuzz/header fuzz/corpus/header
	$(BIN)/python fuzz/fuzz_numpy_records.py -max_total_time=300 /tmp/superserial-fuzz/records fuzz/corpus/records

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info .pytest_cache .hypothesis
