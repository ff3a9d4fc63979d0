# Ferry: two commands on a fresh machine — `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: venv demo test lint unit bench proto clean etcd graphviz triton-env

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	# xds-protos ships an old copy of opentelemetry-proto's files; the package installed last owns them
	$(PY) -m pip install -q --force-reinstall --no-deps "$$(grep -o 'opentelemetry-proto==[0-9.]*' pyproject.toml)"
	touch $(STAMP)

venv: $(STAMP)

demo: venv graphviz
	$(PY) -m tools.demo

lint: venv
	$(PY) -m tools.genproto --check
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

etcd:
	tools/ensure_etcd.sh

graphviz:
	tools/ensure_graphviz.sh

triton-env:
	bash tools/triton/setup_env.sh

test: venv etcd graphviz triton-env lint
	GRPC_VERBOSITY=ERROR $(VENV)/bin/pytest -q

unit: venv
	GRPC_VERBOSITY=ERROR $(VENV)/bin/pytest -q -m 'not e2e and not etcd and not triton and not slow'

bench: venv
	$(PY) -m tools.bench.overhead

proto: venv
	$(PY) -m tools.genproto

clean:
	rm -rf $(VENV) bench-results .mypy_cache .ruff_cache
