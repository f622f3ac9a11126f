#!/usr/bin/env bash
# make gpu-check on a GPU machine that cannot reach PyPI but has Python, torch (CUDA),
# numpy, matplotlib, networkx and pytest (as the device machines lent to this project do).
#
#   bash scripts/gpu_offline.sh prepare [DIR]   here, with network: the wheels it lacks
#                                              (Ray without its Java jars, which keeps it
#                                              under 64 MiB, and Ray's pure-Python needs)
#   bash scripts/gpu_offline.sh run [DIR]       there, in the repository's root: install
#                                              them into /tmp/site and run gpu_check.py
#
# DIR defaults to .whl (keep it out of git: echo /.whl/ >> .git/info/exclude). The C fast
# path is not built there (CGRAPH_PURE_PYTHON=1): the checks are about CUDA, not it.
# Python 3.12 on the GPU machine; set PYVER for another.
set -euo pipefail
MODE="${1:?prepare or run}"
DIR="${2:-.whl}"
PYVER="${PYVER:-3.12}"
RAY="${RAY:-2.60.0}"
case "$MODE" in
prepare)
  mkdir -p "$DIR"
  tmp="$(mktemp -d)"
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$PYVER" \
    --implementation cp --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux_2_28_x86_64 -d "$tmp" "ray==$RAY" jsonschema jsonschema-specifications \
    referencing rpds-py graphviz pytest-timeout
  python3 - "$tmp" "$DIR" <<'PY'
import pathlib, shutil, sys, zipfile
src, dst = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
for wheel in src.glob("*.whl"):
    if not wheel.name.startswith("ray-"):
        shutil.copy(wheel, dst / wheel.name)
        continue
    with zipfile.ZipFile(wheel) as zin, zipfile.ZipFile(dst / wheel.name, "w", zipfile.ZIP_DEFLATED) as zout:
        for item in zin.infolist():
            if not item.filename.startswith(("ray/jars/", "ray/rllib/")):
                zout.writestr(item, zin.read(item.filename), compress_type=item.compress_type)
PY
  rm -rf "$tmp"
  du -sh "$DIR"
  ;;
run)
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site "$DIR"/*.whl
  export PYTHONPATH="/tmp/site:$PWD" CGRAPH_PURE_PYTHON=1 PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1
  exec python3 scripts/gpu_check.py
  ;;
*)
  echo "usage: $0 prepare|run [DIR]" >&2
  exit 2
  ;;
esac
