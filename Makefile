# What people type. The README's two set-up commands are `make selftest` and `make test`;
# .ci/run calls `make test` and nothing else.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
WHEEL_DIR := dist
# Releases the SGLang-backed tier runs on: `ci` is releases.CI_RELEASES in the package;
# `make test SGLANG_RELEASES=all` runs every supported one.
SGLANG_RELEASES ?= ci
# SGLang-backed test sessions run two at a time: alone, a session averages under one core (it
# imports SGLang on one, then waits on its nodes), so two, with the unit tier beside them, keep
# the 2-core CI machine busy; the third starts when one ends (a fresh-clone pool: 2,345 s, and
# 2,489 s three at a time).
SGLANG_TEST_JOBS ?= 2

.PHONY: venv build-dev wheel install lint rust-check python-lint type-check stub-check test \
	test-build test-unit-and-venv test-series sglang-envs series-tests test-sglang-pool test-unit \
	test-registered benchmark-smoke benchmark-smoke-installed selftest benchmark hostile \
	fresh-venv-check fresh-venv-check-built sdist-check patches-check patches-lint patched-wheel \
	test-patched test-sglang test-rest demo stress validate faults slurm clean

venv: $(PY)
$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	$(PIP) install --quiet "maturin>=1.7,<2"

# Editable install for day-to-day work: the native module is built into python/.
build-dev: venv
	$(VENV)/bin/maturin develop --release --extras test

# The one wheel everything here installs and tests: built by pip from the unpacked sdist (the
# PEP 517 build a source install runs), abi3 for CPython 3.10+, manylinux2014 (glibc 2.17+)
# through zig from PyPI's ziglang; auditwheel must confirm the tag. The cargo target directory
# is kept across builds; the sdist is unpacked with fresh times (the archive's are fixed), so
# cargo rebuilds this project's crate and reruns its build script, and reuses the rest.
SDIST_DIR := dist-sdist
SDIST_SRC := $(SDIST_DIR)/src
PORTABLE_TAG := manylinux_2_17_$(shell uname -m)
wheel: venv
	$(PIP) install --quiet ziglang auditwheel
	rm -rf $(WHEEL_DIR) $(SDIST_DIR)
	$(VENV)/bin/maturin sdist --out $(SDIST_DIR)
	mkdir -p $(SDIST_SRC)
	tar -xzf $(SDIST_DIR)/*.tar.gz -C $(SDIST_SRC) --strip-components=1 --touch
	PATH="$(abspath $(VENV))/bin:$$PATH" CARGO_TARGET_DIR="$(abspath target)" \
		MATURIN_PEP517_ARGS="--zig --compatibility manylinux2014" \
		$(PIP) wheel --quiet --no-build-isolation --no-deps --wheel-dir $(WHEEL_DIR) \
		./$(SDIST_SRC)
	$(VENV)/bin/auditwheel show $(WHEEL_DIR)/*.whl | tee $(SDIST_DIR)/auditwheel.txt
	grep -q '"$(PORTABLE_TAG)"' $(SDIST_DIR)/auditwheel.txt || \
		{ echo "wheel is not $(PORTABLE_TAG): see $(SDIST_DIR)/auditwheel.txt"; exit 1; }

# Tests run against the built wheel, as users get it, not against the source tree.
install: wheel
	$(PIP) install --quiet "$$(ls $(WHEEL_DIR)/*.whl)[test]"
	$(PIP) install --quiet --force-reinstall --no-deps "$$(ls $(WHEEL_DIR)/*.whl)"

# The lint tools, pinned here, installed into the venv once (again whenever this file changes).
LINT_TOOLS := "ruff==0.14.10" "mypy==2.4.1" "types-jsonschema==4.26.0.20261006"
LINT_STAMP := $(VENV)/.lint-tools
$(LINT_STAMP): Makefile | $(PY)
	$(PIP) install --quiet $(LINT_TOOLS)
	echo $(LINT_TOOLS) > $@

rust-check:
	cargo fmt --check
	cargo clippy --all-targets --all-features -- -D warnings
	cargo test

python-lint: $(LINT_STAMP) type-check stub-check
	$(VENV)/bin/ruff check python tests test-registered scripts
	$(VENV)/bin/ruff format --check python tests test-registered scripts
	$(PYTHON) scripts/import_cycles.py

# mypy --strict on the whole package (the files and settings are pyproject's).
type-check: $(LINT_STAMP)
	$(VENV)/bin/mypy

# _native.pyi (the source tree's) against the module as built: the installed wheel, built and
# installed first when this venv has none.
stub-check: $(LINT_STAMP)
	$(PY) -c "import sglang_sidecar_overlay._native" 2>/dev/null || $(MAKE) install
	MYPYPATH=python $(PY) -m mypy.stubtest sglang_sidecar_overlay._native

lint: rust-check python-lint

test-unit:
	$(PY) -m pytest tests

test-registered:
	$(PY) scripts/sglang_envs.py test --releases $(SGLANG_RELEASES) --jobs $(SGLANG_TEST_JOBS) \
		--wheel-dir $(WHEEL_DIR)

# Two jobs side by side first: the Rust checks and the wheel (one core's work at a time), and
# the SGLang tier's cached envs (downloads and installs, built only when missing) with the
# rebuilt wheel of the upstream series; then the SGLang pool (scripts/pool_plan.py's sessions),
# with the series' lint and own tests, the unit tier and the fresh-venv check beside it (one
# core's work, while the sessions' nodes often wait), and the benchmark's smoke pass as the
# pool's last job: it starts when a session ends and none waits, beside the last session,
# instead of alone after it. Each job's steps keep their order. Every phase's wall time is
# printed at the end, passed or not (scripts/phases.py); a pool session over twice its budget
# fails the run, named.
test:
	$(PHASES) reset
	status=0; \
	$(MAKE) --no-print-directory -j2 --output-sync=line test-build test-series || status=$$?; \
	[ $$status -ne 0 ] || $(MAKE) --no-print-directory -j2 --output-sync=line test-sglang-pool \
		test-unit-and-venv POOL_LAST_JOB="$(PY) scripts/benchmark.py --smoke" || status=$$?; \
	$(PHASES) report; exit $$status

PHASES := $(PYTHON) scripts/phases.py
PHASE := $(PHASES) run
# Each step alone, in order, as before (a prerequisite list run in parallel would race).
SUBMAKE := $(MAKE) --no-print-directory -j1

test-build:
	$(PHASE) rust-check -- $(SUBMAKE) rust-check
	$(PHASE) "wheel and install" -- $(SUBMAKE) install
	$(PHASE) python-lint -- $(SUBMAKE) python-lint

# Beside the pool: the series' lint and its own tests (off the pool's start), the unit tier and
# the fresh-venv check.
test-unit-and-venv:
	$(PHASE) "series: upstream lint" -- $(SUBMAKE) patches-lint
	$(PHASE) "series: its own tests" -- $(SUBMAKE) series-tests
	$(PHASE) "unit tier (tests/)" -- $(SUBMAKE) test-unit
	$(PHASE) fresh-venv-check -- $(SUBMAKE) fresh-venv-check-built

# What the pool needs and the project wheel does not: the SGLang envs, then the upstream
# series applied and rebuilt into its env.
test-series:
	$(PHASE) "SGLang envs" -- $(SUBMAKE) sglang-envs
	$(PHASE) "series: rebuilt wheel" -- $(SUBMAKE) patches-check

# The releases' envs and the next Dynamo versions' envs (each cached under
# SGLANG_OVERLAY_CACHE, built under its own lock, so the steps that need them later only find
# them); patches-check builds the rebuilt wheel's.
sglang-envs:
	$(PYTHON) scripts/sglang_envs.py build --releases $(SGLANG_RELEASES)

series-tests:
	$(PYTHON) scripts/patches.py series-tests

# What `make test` runs of test-registered and test-patched: the series' own tests, then the
# releases' sessions and the rebuilt wheel's in one pool, SGLANG_TEST_JOBS side by side.
test-sglang: series-tests test-sglang-pool

# With the default releases the pool runs scripts/pool_plan.py's `ci` plan: each side only on
# what can differ there, 0.5.23's files in two sessions so that the slots pack. Any other
# SGLANG_RELEASES (`all`) runs every file on each release and on the rebuilt wheel.
POOL_SELECTION = $(if $(filter ci,$(SGLANG_RELEASES)),--plan ci,--releases $(SGLANG_RELEASES) \
	--with-patched)

test-sglang-pool:
	$(PHASE) "SGLang pool" -- $(PY) scripts/sglang_envs.py test $(POOL_SELECTION) \
		--jobs $(SGLANG_TEST_JOBS) --wheel-dir $(WHEEL_DIR) \
		$(if $(POOL_LAST_JOB),--last-job "$(POOL_LAST_JOB)")

# What make test's plan leaves out (scripts/pool_plan.py's `rest`): with make test, every
# scenario file on 0.5.21, 0.5.23 and the rebuilt wheel.
test-rest: install
	$(PY) scripts/sglang_envs.py test --plan rest --jobs $(SGLANG_TEST_JOBS) \
		--wheel-dir $(WHEEL_DIR)

# Every benchmark row once with tiny durations, nothing written: keeps `make benchmark` from
# rotting (rows 4, 5, 7 and 8 use the cached SGLang envs; row 8 launches one SGLang node per
# side, about a minute). `make test` runs it as the SGLang pool's last job.
benchmark-smoke: install benchmark-smoke-installed

# The same on the wheel already installed (`make test` built and installed it before the pool).
benchmark-smoke-installed:
	$(PY) scripts/benchmark.py --smoke

# The upstream patch series (patches/): apply it to the released SGLang tree with git am,
# repack and install the rebuilt wheel into a cached env (scripts/patches.py).
patches-check:
	$(PYTHON) scripts/patches.py check

# Upstream SGLang's pre-commit hooks at upstream's pins (black, isort, codespell,
# pre-commit-hooks) on the files the series adds or changes; the tools' venv is cached.
patches-lint:
	$(PYTHON) scripts/patches.py lint

# The rebuilt SGLang wheel, for `pip install dist-patched/sglang-*.whl`.
patched-wheel:
	$(PYTHON) scripts/patches.py wheel --out dist-patched

# The series' own upstream-layout tests, then the scenarios of test-registered/, against the
# rebuilt wheel with the plugin not loaded.
test-patched:
	$(PYTHON) scripts/patches.py series-tests
	$(PY) scripts/sglang_envs.py test --patched --releases 0.5.23 --wheel-dir $(WHEEL_DIR)

selftest: install
	$(VENV)/bin/sglang-sidecar-overlay selftest

# KV-aware routing to a follower node on this machine: a two-node SGLang group (real schedulers
# on the CPU) behind Dynamo's released sidecars and router, in private network namespaces
# (root). Prints the commands it runs and where each prompt was routed.
demo: install
	$(PYTHON) scripts/sglang_envs.py demo --wheel-dir $(WHEEL_DIR)

benchmark: install
	$(PY) scripts/benchmark.py

# The seeds' validation table at the seed's full shapes: stock 0.5.23, 0.5.23 with the
# overlay and the rebuilt wheel, Dynamo 1.6.1 in front; writes docs/validation.md. Not part of
# `make test` (which asserts the overlay's column): about an hour on this machine type.
validate: install
	$(PY) scripts/validate.py --wheel-dir $(WHEEL_DIR)

# The fault table: the seeds' deployments under a steady load through Dynamo's frontend while a
# sidecar, a scheduler or a whole group fails, stock beside the overlay; writes
# docs/faults.md. Not part of `make test` (which asserts rows a, c and f on the overlay).
faults: install
	$(PY) scripts/faults.py --wheel-dir $(WHEEL_DIR)

# docs/deployment.md's Slurm script run as written: a real Slurm cluster on this machine
# (slurmctld, one slurmd per node, each node its own network namespace; munge; etcd as Dynamo's
# discovery), deployment 2 submitted with sbatch, the seed's measures through its Dynamo
# frontend, then scancel under load (fault row f). Root; installs Debian's slurm-wlm, munge,
# etcd-server and etcd-client when missing. Not part of `make test` (its unit tier renders the
# script): 5 to 10 minutes on this machine type.
slurm: install
	$(PY) scripts/slurm.py --wheel-dir $(WHEEL_DIR)

# The unit tier and one SGLang session, three times each, started as a background job
# (SIGINT ignored, no terminal) under a CPU hog on every core: docs/compatibility.md.
stress: install
	$(PY) scripts/stress.py

# Hostile clients against this project's metadata server and upstream's: docs/hostile-input.md.
hostile: install
	$(PY) scripts/hostile.py

# The wheel from the sdist, installed alone into a fresh virtualenv: the selftest must pass
# with nothing but its declared dependencies.
FRESH_VENV := .fresh-venv
fresh-venv-check: wheel fresh-venv-check-built

# The same with the wheel already built (`make test` builds it before the SGLang sessions, which
# install it at the same time: no rebuild under them).
fresh-venv-check-built:
	rm -rf $(FRESH_VENV)
	$(PYTHON) -m venv $(FRESH_VENV)
	$(FRESH_VENV)/bin/pip install --quiet $(WHEEL_DIR)/*.whl
	$(FRESH_VENV)/bin/sglang-sidecar-overlay selftest

# A plain source install, as on another architecture: pip builds the sdist with cargo and the
# system linker (a full release build, so not part of `make test`; the wheel above is built
# from the same sdist by the same PEP 517 hook).
SDIST_VENV := .sdist-venv
sdist-check: wheel
	rm -rf $(SDIST_VENV)
	$(PYTHON) -m venv $(SDIST_VENV)
	$(SDIST_VENV)/bin/pip install --quiet $(SDIST_DIR)/*.tar.gz
	$(SDIST_VENV)/bin/sglang-sidecar-overlay selftest

clean:
	rm -rf $(WHEEL_DIR) dist-patched $(SDIST_DIR) $(FRESH_VENV) $(SDIST_VENV) target $(VENV)
