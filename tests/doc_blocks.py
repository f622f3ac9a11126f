"""The code blocks of README.md and docs/*.md, for the tests that keep them true.

Every fenced block names its language, which says what the tests do with it:

- ``python``: executed, block after block in one namespace per file (so a later block
  may use what an earlier one defined), by tests/ray/test_doc_examples.py on the local
  CPU cluster; a block that raises fails the test. A block preceded by the line
  ``<!-- gpu -->`` needs CUDA and is skipped without it.
- ``bash`` / ``console``: not run; tests/unit/test_doc_blocks.py checks that every
  ``make X`` names a Makefile target and every path into the repository exists.
- ``text``: output samples, pictures in ASCII, sketches; not run.

docs/design-notes.md is the history of decisions and holds no runnable code; it is
not checked.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LANGUAGES = ("python", "bash", "console", "text")
GPU_MARKER = "<!-- gpu -->"
FENCE = re.compile(r"^(```+|~~~+)\s*([\w+-]*)\s*$")


@dataclass(frozen=True)
class Block:
    """One fenced code block: where it is, its language, its text, and whether it needs a GPU."""

    path: Path
    line: int  # of the opening fence, 1-based
    language: str
    code: str
    gpu: bool

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def documents() -> list[Path]:
    """README.md and every docs/*.md but the design notes."""
    docs = sorted(p for p in (ROOT / "docs").glob("*.md") if p.name != "design-notes.md")
    return [ROOT / "README.md", *docs]


def blocks(path: Path) -> list[Block]:
    """The fenced blocks of one Markdown file, in order.

    Raises:
        ValueError: a fence is never closed.
    """
    lines = path.read_text().splitlines()
    found: list[Block] = []
    i = 0
    while i < len(lines):
        match = FENCE.match(lines[i])
        if not match:
            i += 1
            continue
        fence, language, start = match.group(1), match.group(2), i
        end = next((j for j in range(i + 1, len(lines)) if lines[j].strip() == fence), None)
        if end is None:
            raise ValueError(f"{path}:{start + 1}: a code fence is never closed")
        before = next((lines[j].strip() for j in range(start - 1, -1, -1) if lines[j].strip()), "")
        found.append(Block(path, start + 1, language, "\n".join(lines[start + 1:end]) + "\n",
                           before == GPU_MARKER))
        i = end + 1
    return found
