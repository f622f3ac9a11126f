#!/usr/bin/env bash
# The test command: unit tests (no Ray), Ray tests (local CPU cluster), GPU tests
# (skipped without CUDA). Exit status is pytest's.
set -uo pipefail
PY="${1:-.venv/bin/python}"
export OMP_NUM_THREADS=1
export RAY_DEDUP_LOGS=0
# unit tests first: they check that nothing in them starts Ray, and tests/ray
# keeps one Ray instance alive until the end of the session.
"$PY" -m pytest tests/unit tests/ray tests/gpu -q -p no:cacheprovider "${@:2}"
rc=$?
if [ $rc -eq 5 ]; then echo "no tests collected"; fi
exit $rc
