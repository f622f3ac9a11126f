#!/usr/bin/env bash
# Line coverage of the test suite, actor processes included (not part of `make test`).
#   bash scripts/coverage.sh [pytest paths...]       default: tests/unit tests/ray
# Every process the run starts (Ray's workers inherit the environment) measures itself
# (scripts/coverage_site/sitecustomize.py); an actor's loop thread, which Ray's C++ core
# starts, is traced from the loop's entry (cgraph/runtime/coverage_hook.py). Prints
# the report of cgraph/; the data is in .coverage-run/.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
DATA="$PWD/.coverage-run"
rm -rf "$DATA" && mkdir -p "$DATA"
cat > "$DATA/coveragerc" <<RC
[run]
source = cgraph
parallel = true
concurrency = thread
sigterm = true
data_file = $DATA/.coverage
RC
export COVERAGE_PROCESS_START="$DATA/coveragerc" OMP_NUM_THREADS=1 RAY_DEDUP_LOGS=0
export PYTHONPATH="$PWD/scripts/coverage_site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
paths=("$@"); [ ${#paths[@]} -gt 0 ] || paths=(tests/unit tests/ray)
"$PY" -m pytest "${paths[@]}" -q -p no:cacheprovider
rc=$?
"$PY" -m coverage combine --rcfile="$DATA/coveragerc" -q "$DATA" >/dev/null
"$PY" -m coverage report --rcfile="$DATA/coveragerc" --data-file="$DATA/.coverage"
exit $rc
