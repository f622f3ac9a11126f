#!/usr/bin/env bash
# The test command: unit tests (no Ray), then Ray tests (a local CPU cluster per worker)
# and GPU tests (skipped without CUDA). Both phases run on pytest-xdist workers: the unit
# tests one by one, the Ray tests a file at a time (a file's module fixtures, such as
# the two-node script, run once). Unit tests check that they never start Ray, so the
# phases never share a worker. Exit status: the first phase that failed, else 0.
set -uo pipefail
PY="${1:-.venv/bin/python}"
WORKERS="${CGRAPH_TEST_WORKERS:-3}"
export OMP_NUM_THREADS=1
export RAY_DEDUP_LOGS=0
"$PY" -m pytest tests/unit -q -p no:cacheprovider -n "$WORKERS" "${@:2}"
unit=$?
"$PY" -m pytest tests/ray tests/gpu -q -p no:cacheprovider -n "$WORKERS" --dist loadfile "${@:2}"
rest=$?
for rc in $unit $rest; do
    if [ "$rc" -eq 5 ]; then echo "no tests collected"; fi
    if [ "$rc" -ne 0 ]; then exit "$rc"; fi
done
exit 0
