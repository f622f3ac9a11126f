# cgraph: two commands do all the set-up on a fresh machine.
#   make run    the main job (the overlap example on a local Ray cluster)
#   make test   the test suite
#   make gpu-check  for users with GPUs: what cgraph's GPU path does here (see scripts/gpu_check.py)
# Both create .venv and install on first use (see scripts/setup.sh).

VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: run test gpu-check setup lint typecheck bench clean

$(STAMP): pyproject.toml scripts/setup.sh
	bash scripts/setup.sh $(VENV)
	@touch $(STAMP)

setup: $(STAMP)

run: $(STAMP)
	OMP_NUM_THREADS=1 CGRAPH_VISUALIZE_SCHEDULE=1 $(PY) examples/overlap.py

test: $(STAMP)
	bash scripts/test.sh $(PY)

gpu-check: $(STAMP)
	OMP_NUM_THREADS=1 $(PY) scripts/gpu_check.py

lint: $(STAMP)
	$(VENV)/bin/ruff check cgraph tests benchmarks examples
	$(VENV)/bin/mypy --follow-imports=silent cgraph/ir cgraph/scheduler

bench: $(STAMP)
	OMP_NUM_THREADS=1 $(PY) benchmarks/run_all.py

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
