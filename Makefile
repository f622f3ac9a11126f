# cgraph: two commands do all the set-up on a fresh machine.
#   make run    the main job (the overlap example on a local Ray cluster)
#   make test   the test suite
#   make test-fast  the inner loop: unit tests without the slow files, on 2 workers (under a minute)
#   make gpu-check  for users with GPUs: what cgraph's GPU path does here (see scripts/gpu_check.py)
#   make docs   the API reference (pdoc) into build/docs
#   make bench  every benchmark, then the README's tables from their results
# Both create .venv and install on first use (see scripts/setup.sh).

VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: run test test-fast gpu-check setup lint typecheck bench docs soak clean

$(STAMP): pyproject.toml scripts/setup.sh
	bash scripts/setup.sh $(VENV)
	@touch $(STAMP)

setup: $(STAMP)

run: $(STAMP)
	OMP_NUM_THREADS=1 CGRAPH_VISUALIZE_SCHEDULE=1 $(PY) examples/overlap.py

test: $(STAMP)
	bash scripts/test.sh $(PY)

test-fast: $(STAMP)
	OMP_NUM_THREADS=1 $(PY) -m pytest tests/unit -m "not slow" -n 2 -q -p no:cacheprovider

gpu-check: $(STAMP)
	OMP_NUM_THREADS=1 $(PY) scripts/gpu_check.py

lint: $(STAMP)
	$(VENV)/bin/ruff check cgraph tests benchmarks examples scripts
	$(VENV)/bin/mypy --follow-imports=silent cgraph

bench: $(STAMP)
	OMP_NUM_THREADS=1 $(PY) benchmarks/run_all.py; status=$$?; \
	$(PY) scripts/readme_tables.py && exit $$status

docs: $(STAMP)
	$(PY) scripts/build_docs.py build/docs

# fault soak: 200 random DAGs, one fault each, ~30 min; writes benchmarks/results/fault_soak.{json,md}
# across loopback nodes: make soak SOAK_ARGS="--nodes 3 --trials 100" (results/fault_soak_nodes.*)
soak: $(STAMP)
	OMP_NUM_THREADS=1 $(PY) benchmarks/fault_soak.py $(SOAK_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
