#!/usr/bin/env bash
# The test command: unit tests (no Ray) on pytest-xdist workers, then Ray tests (one local
# CPU cluster, shared by the whole phase) and GPU tests (skipped without CUDA) in one
# process. Unit tests check that they never start Ray, so the phases never share a
# process. Measured on the 2-core VM (docs/design-notes.md): two workers take the unit
# phase from ~3.7 to ~2.3 min; the Ray phase is CPU-bound and gains nothing from workers
# that each start a Ray cluster (12.5 min on two, 15 on three, 13 in one process).
# Exit status: the first phase that failed, else 0.
set -uo pipefail
PY="${1:-.venv/bin/python}"
WORKERS="${CGRAPH_TEST_WORKERS:-2}"
export OMP_NUM_THREADS=1
export RAY_DEDUP_LOGS=0
"$PY" -m pytest tests/unit -q -p no:cacheprovider -n "$WORKERS" "${@:2}"
unit=$?
"$PY" -m pytest tests/ray tests/gpu -q -p no:cacheprovider "${@:2}"
rest=$?
for rc in $unit $rest; do
    if [ "$rc" -eq 5 ]; then echo "no tests collected"; fi
    if [ "$rc" -ne 0 ]; then exit "$rc"; fi
done
exit 0
