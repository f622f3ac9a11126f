"""Build the API reference of ``cgraph`` and ``cgraph.collective`` with pdoc.

    .venv/bin/python scripts/build_docs.py [OUT]        # make docs; OUT defaults to build/docs

Only the public modules are documented (their ``__all__``; submodules are
internal). Docstrings are Google style. pdoc runs in a child process; anything
it prints that mentions a warning fails the build, as does its exit status, so
a docstring pdoc cannot render is caught here and not in a browser.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODULES = ["cgraph", r"!cgraph\..*", "cgraph.collective", r"!cgraph\.collective\..*"]
WARNING = re.compile(r"warn", re.IGNORECASE)


def build(out: Path) -> tuple[int, str]:
    """Run pdoc into ``out``; returns (exit status, everything it printed)."""
    command = [sys.executable, "-m", "pdoc", "--docformat", "google", "--no-show-source",
               "--footer-text", "cgraph", "--output-directory", str(out), *MODULES]
    env = {**os.environ, "PYTHONWARNINGS": "default", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    return proc.returncode, proc.stdout + proc.stderr


def main(argv: list[str]) -> int:
    out = Path(argv[0]) if argv else ROOT / "build" / "docs"
    status, printed = build(out)
    if printed:
        print(printed, end="" if printed.endswith("\n") else "\n")
    if status != 0 or WARNING.search(printed):
        print(f"make docs: pdoc {'failed' if status else 'warned'}; fix the docstrings above",
              file=sys.stderr)
        return 1
    pages = sorted(p.relative_to(out) for p in out.rglob("*.html"))
    print(f"API reference: {out / 'index.html'} ({len(pages)} pages: "
          f"{', '.join(map(str, pages))})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
