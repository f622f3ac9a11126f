#!/usr/bin/env bash
# Create the project's virtual environment and install cgraph into it.
#
# - Prefers the machine's local CPU build of PyTorch (torch==2.13.0) when one is
#   reachable without the network-wide index (these dev/CI machines keep one in
#   pip's find-links), so a bare `torch` requirement never pulls GBs of CUDA
#   packages. Elsewhere an already-installed torch is left alone, and otherwise
#   pip resolves torch from the package's loose requirement.
# - Installs graphviz's `dot` from Debian when it is missing and we are root.
set -euo pipefail
VENV="${1:-.venv}"
PYTHON="${PYTHON:-python3}"

if [ ! -x "$VENV/bin/python" ]; then
    echo "[setup] creating $VENV with $($PYTHON --version)"
    "$PYTHON" -m venv "$VENV"
fi
PIP=("$VENV/bin/python" -m pip install --disable-pip-version-check -q)
# Some machines list find-links folders that do not exist; pip warns per package.
quiet_pip() { "${PIP[@]}" "$@" 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2); }

if "$VENV/bin/python" -c "import torch" 2>/dev/null; then
    echo "[setup] keeping installed torch $("$VENV/bin/python" -c 'import torch; print(torch.__version__)')"
elif "$VENV/bin/python" -m pip download --disable-pip-version-check -q --no-index --no-deps \
        -d "$VENV/.torch-probe" "torch==2.13.0" >/dev/null 2>&1; then
    # A local CPU wheel is in pip's find-links: pinning the version makes pip take it.
    rm -rf "$VENV/.torch-probe"
    quiet_pip "torch==2.13.0"
    echo "[setup] installed the local CPU build of torch $("$VENV/bin/python" -c 'import torch; print(torch.__version__)')"
else
    echo "[setup] no local CPU torch wheel; pip will resolve torch from PyPI"
fi

quiet_pip -e ".[dev]"

if ! command -v dot >/dev/null 2>&1; then
    if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
        echo "[setup] installing graphviz (dot) from Debian"
        (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq graphviz >/dev/null) \
            || echo "[setup] could not install graphviz; schedule pictures will be written as .dot files"
    else
        echo "[setup] graphviz 'dot' not found; pictures will be .dot files (install: apt-get install graphviz)"
    fi
fi
echo "[setup] done"
