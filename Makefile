# tunefarm: the two commands of the README work on a fresh clone.
#   make demo   creates .venv, installs, makes the example models, tunes one, prints the result
#   make test   creates .venv, installs, runs the whole test suite
PYTHON ?= python3
VENV   ?= .venv
BIN     = $(VENV)/bin
TRIALS ?= 16

.PHONY: venv demo test test-fast bench lint clean

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

test: venv
	$(BIN)/python -m pytest -q -rfE

test-fast: venv
	$(BIN)/python -m pytest -q -m "not slow and not faults"

lint: venv
	$(BIN)/ruff check farm workers tests bench examples

bench: venv
	$(BIN)/python bench/run.py

clean:
	rm -rf runs .pytest_cache
