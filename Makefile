# tunefarm: the two commands of the README work on a fresh clone.
#   make demo   creates .venv, installs, makes the example models, tunes one, prints the result
#   make test   creates .venv, installs, runs the whole test suite
PYTHON ?= python3
VENV   ?= .venv
BIN     = $(VENV)/bin
TRIALS ?= 16

.PHONY: dist test-pythons bench-full bench-quality bench-spread bench-rss bench-warm bench-warm-model bench-learn venv system-deps arm64-tools browser demo test test-fast bench lint clean

$(BIN)/farm: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e ".[all]"
	@touch $(BIN)/farm

venv: $(BIN)/farm

# the sdist and the wheel in dist/ (tunefarm is not on PyPI yet: `pip install
# dist/tunefarm-*.whl`, with `[torch]` on a submitting machine); `twine upload dist/*`
# publishes them
dist: venv
	rm -rf dist
	$(BIN)/python -m build --outdir dist .

examples/resnet.pt2: examples/make_models.py | venv
	$(BIN)/python examples/make_models.py examples

demo: venv examples/resnet.pt2
	FARM_HOME=$${FARM_HOME:-$(CURDIR)/runs/.farm-home} $(BIN)/farm submit examples/resnet.pt2 \
		--trials-per-task $(TRIALS) --out runs/demo --force

# Debian packages some tests need: Chromium (the report is rendered in a real browser), the
# compose client (docker-compose.yml is checked with it), and for the emulated arm64 phone,
# qemu user mode and the aarch64 cross compiler (with its C library); Prometheus (`farm up
# --prometheus-port` is checked scraping a real worker); and Redis's server, which every
# integration test starts a private one of; for the OpenCL phones, the OpenCL headers and ICD
# loader (TVM's OpenCL runtime is built against them) and pocl (the CPU as an OpenCL device).
# A program is looked up on PATH, a file by its path.
SYSTEM_TOOLS = redis-server:redis-server chromium:chromium docker-compose:docker-compose \
	qemu-aarch64-static:qemu-user-static \
	aarch64-linux-gnu-g++:g++-aarch64-linux-gnu \
	prometheus:prometheus \
	/usr/include/CL/cl.h:opencl-headers \
	/usr/lib/x86_64-linux-gnu/libOpenCL.so:ocl-icd-opencl-dev \
	/etc/OpenCL/vendors/pocl.icd:pocl-opencl-icd

system-deps:
	@missing=""; for pair in $(SYSTEM_TOOLS); do [ -e $${pair%%:*} ] || \
		command -v $${pair%%:*} >/dev/null || \
		PATH="$$PATH:/usr/sbin:/sbin" command -v $${pair%%:*} >/dev/null || \
		missing="$$missing $${pair##*:}"; done; \
	if [ -n "$$missing" ]; then \
		if [ "$$(id -u)" = 0 ]; then apt-get -o DPkg::Lock::Timeout=600 update -qq && \
			DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq $$missing >/dev/null; \
		else echo "make: missing Debian packages:$$missing (apt-get install them as root)"; fi; \
	fi

arm64-tools browser: system-deps

# tests run in a shuffled order (modules, and tests within a module), with a fixed seed so that
# a failure can be replayed: `make test TEST_SEED=N`; every test also passes alone
TEST_SEED ?= 20261201

test: venv system-deps lint
	$(BIN)/python -m pytest -q -rfE --durations=15 --random-order-bucket=module \
		--random-order-seed=$(TEST_SEED)

test-fast: venv
	$(BIN)/python -m pytest -q -m "not slow and not faults and not arm64"

# The unit tests on every Python the farm supports that this machine has (3.10-3.12; 3.11
# is .venv's): each in its own .venv-pyX.Y, made once
PYTHONS ?= 3.10 3.12
test-pythons:
	bash scripts/test-pythons.sh $(PYTHONS)

# ruff, the layers as contracts (import-linter: [tool.importlinter] in pyproject.toml), a type
# check (mypy: [tool.mypy]), and the rules
# of scripts/rules.py (modules <= 600 lines, functions <= 60, FARM_* read by the config only)
lint: venv
	$(BIN)/ruff check farm workers tests bench examples scripts
	$(BIN)/lint-imports --no-logo
	$(BIN)/mypy
	$(BIN)/python scripts/rules.py

bench: venv
	$(BIN)/python bench/run.py

bench-full: venv
	$(BIN)/python bench/run.py --models resnet,transformer

# the tuned latency of one tuning run varies from run to run: 3 runs per side, medians
bench-spread: venv
	$(BIN)/python bench/run.py --models resnet --repeats 3 --quality "" --scaling "" \
		--out bench/spread

# issue 17's quality bench: three model families (residual CNN, two-headed depthwise mobile
# net, transformer block) at 64 trials per task, farm vs plain MetaSchedule 3 times each
# (medians), tuned vs untuned vs torch with 1 thread and with 4 where the machine has 4
# cores; hours on a 2-core machine (plain MetaSchedule alone: tens of minutes per run)
bench-quality: venv
	$(BIN)/python bench/run.py --trials 64 --models resnet,mobilenet,transformer --repeats 3 \
		--quality resnet,mobilenet,transformer --threads 1,4 --scaling "" --out bench/quality

# warm vs cold store: trials until a new workload is near its best, with the key's cost model
bench-warm: venv
	$(BIN)/python bench/warm.py

# ... and on held-out models: a store filled by tuning the CNN and the transformer block, then
# the mobile block (depthwise) tuned against it and against a fresh store, 64 trials per task
bench-warm-model: venv
	$(BIN)/python bench/warm_model.py --fill resnet,transformer --held-out mobile

# issue 47: held-out models on a store of other models, of unrelated ones, and a fresh one,
# against plain MetaSchedule (bench/learn.md; about an hour here)
bench-learn: venv
	$(BIN)/python bench/learn.py

bench-rss: venv
	$(BIN)/python bench/rss.py

clean:
	rm -rf runs .pytest_cache
