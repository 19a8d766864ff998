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

.PHONY: venv build-dev wheel install lint rust-check python-lint test test-unit test-registered \
	benchmark-smoke selftest benchmark hostile wheel-portable sdist-check patches-check \
	patched-wheel test-patched clean

venv: $(PY)
$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	$(PIP) install --quiet "maturin>=1.7,<2"

# Editable install for day-to-day work: the native module is built into python/.
build-dev: venv
	$(VENV)/bin/maturin develop --release --extras test

wheel: venv
	rm -rf $(WHEEL_DIR)
	$(VENV)/bin/maturin build --release --out $(WHEEL_DIR)

# Tests run against the built wheel, as users get it, not against the source tree.
install: wheel
	$(PIP) install --quiet "$$(ls $(WHEEL_DIR)/*.whl)[test]"
	$(PIP) install --quiet --force-reinstall --no-deps "$$(ls $(WHEEL_DIR)/*.whl)"

rust-check:
	cargo fmt --check
	cargo clippy --all-targets --all-features -- -D warnings
	cargo test

python-lint:
	$(VENV)/bin/ruff check python tests test-registered scripts
	$(VENV)/bin/ruff format --check python tests test-registered scripts

lint: rust-check python-lint

test-unit:
	$(PY) -m pytest tests

test-registered:
	$(PY) scripts/sglang_envs.py test --releases $(SGLANG_RELEASES) --wheel-dir $(WHEEL_DIR)

test: rust-check install python-lint test-unit patches-check test-registered benchmark-smoke

# Every benchmark row once with tiny durations, nothing written: keeps `make benchmark` from
# rotting (runs after test-registered, whose cached SGLang envs rows 4 and 5 use).
benchmark-smoke: install
	$(PY) scripts/bench.py --smoke

# The upstream patch series (patches/): apply it to the released SGLang tree with git am,
# repack and install the rebuilt wheel into a cached env (scripts/patches.py).
patches-check:
	$(PYTHON) scripts/patches.py check

# The rebuilt SGLang wheel, for `pip install dist-patched/sglang-*.whl`.
patched-wheel:
	$(PYTHON) scripts/patches.py wheel --out dist-patched

# The scenarios of test-registered/ against the rebuilt wheel, the plugin not loaded.
test-patched:
	$(PY) scripts/sglang_envs.py test --patched --releases 0.5.23 --wheel-dir $(WHEEL_DIR)

selftest: install
	$(VENV)/bin/sglang-sidecar-overlay selftest

benchmark: install
	$(PY) scripts/bench.py

# Hostile clients against this project's metadata server and upstream's: docs/hostile-input.md.
hostile: install
	$(PY) scripts/hostile.py

# Installs everywhere (each a full release build of the native module, so not part of `make test`).
# An abi3 wheel for glibc 2.17+ (manylinux2014), linked by zig from PyPI's ziglang; auditwheel
# must confirm the tag.
PORTABLE_DIR := dist-portable
wheel-portable: venv
	$(PIP) install --quiet ziglang auditwheel
	rm -rf $(PORTABLE_DIR)
	PATH="$(abspath $(VENV))/bin:$$PATH" $(VENV)/bin/maturin build --release --zig \
		--compatibility manylinux2014 --out $(PORTABLE_DIR)
	$(VENV)/bin/auditwheel show $(PORTABLE_DIR)/*.whl

# The path for machines without a prebuilt wheel (other architectures): the sdist, installed by
# pip into a fresh virtualenv (cargo builds the native module), then the selftest.
SDIST_DIR := dist-sdist
SDIST_VENV := .sdist-venv
sdist-check: venv
	rm -rf $(SDIST_DIR) $(SDIST_VENV)
	$(VENV)/bin/maturin sdist --out $(SDIST_DIR)
	$(PYTHON) -m venv $(SDIST_VENV)
	$(SDIST_VENV)/bin/pip install --quiet $(SDIST_DIR)/*.tar.gz
	$(SDIST_VENV)/bin/sglang-sidecar-overlay selftest

clean:
	rm -rf $(WHEEL_DIR) dist-patched $(PORTABLE_DIR) $(SDIST_DIR) $(SDIST_VENV) target $(VENV)
