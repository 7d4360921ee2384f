# tunefarm: the two commands of the README work on a fresh clone.
#   make demo   creates .venv, installs, makes the example models, tunes one, prints the result
#   make test   creates .venv, installs, runs the whole test suite
PYTHON ?= python3
VENV   ?= .venv
BIN     = $(VENV)/bin
TRIALS ?= 16

.PHONY: venv browser demo test test-fast bench lint clean

$(BIN)/farm: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e ".[all]"
	@touch $(BIN)/farm

venv: $(BIN)/farm

examples/resnet.pt2: examples/make_models.py | venv
	$(BIN)/python examples/make_models.py examples

demo: venv examples/resnet.pt2
	FARM_HOME=$${FARM_HOME:-$(CURDIR)/runs/.farm-home} $(BIN)/farm submit examples/resnet.pt2 \
		--trials-per-task $(TRIALS) --out runs/demo --force

# The report test renders report.html in a real headless Chromium (Debian's package).
browser:
	@command -v chromium >/dev/null || [ "$$(id -u)" != 0 ] || { apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; } || true
	@command -v chromium >/dev/null || echo "make: chromium is missing (as root: apt-get \
		install chromium); the report test will fail"

test: venv browser
	$(BIN)/python -m pytest -q -rfE

test-fast: venv
	$(BIN)/python -m pytest -q -m "not slow and not faults"

lint: venv
	$(BIN)/ruff check farm workers tests bench examples

bench: venv
	$(BIN)/python bench/run.py

clean:
	rm -rf runs .pytest_cache
