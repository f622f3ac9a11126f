"""README.md and docs/*.md stay true without running anything: every code block names its
language, Python blocks parse, shell blocks name real Makefile targets and real files, and
relative links lead somewhere. tests/ray/test_doc_examples.py runs the Python blocks."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.doc_blocks import LANGUAGES, ROOT, blocks, documents

DOCS = documents()
IDS = [str(p.relative_to(ROOT)) for p in DOCS]
MAKE = re.compile(r"\bmake\s+([A-Za-z][\w-]*)")
REPO_PATH = re.compile(r"(?<![\w/.$-])((?:scripts|benchmarks|examples|tests|docs|cgraph)/[\w./-]*\w)")
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$")


def make_targets() -> set[str]:
    text = (ROOT / "Makefile").read_text()
    return {m.group(1) for m in re.finditer(r"^([A-Za-z][\w.-]*)\s*:(?!=)", text, re.MULTILINE)}


def anchors(path: Path) -> set[str]:
    """GitHub's anchors for the headings of a Markdown file."""
    found, inside = set(), False
    for line in path.read_text().splitlines():
        if line.startswith(("```", "~~~")):
            inside = not inside
        elif not inside and (match := HEADING.match(line)):
            slug = re.sub(r"[^\w\- ]", "", match.group(1).strip().lower()).replace(" ", "-")
            found.add(slug)
    return found


@pytest.mark.parametrize("path", DOCS, ids=IDS)
def test_every_code_block_names_what_it_is(path: Path) -> None:
    unnamed = [b.where for b in blocks(path) if b.language not in LANGUAGES]
    assert not unnamed, f"fences without one of {LANGUAGES} (use text for output and sketches): {unnamed}"


@pytest.mark.parametrize("path", DOCS, ids=IDS)
def test_python_blocks_parse(path: Path) -> None:
    for block in blocks(path):
        if block.language == "python":
            compile(block.code, block.where, "exec")  # a SyntaxError names the block


@pytest.mark.parametrize("path", DOCS, ids=IDS)
def test_make_targets_named_in_the_docs_exist(path: Path) -> None:
    targets = make_targets()
    shell = "".join(b.code for b in blocks(path) if b.language in ("bash", "console"))
    inline = " ".join(re.findall(r"`([^`\n]+)`", path.read_text()))
    named = set(MAKE.findall(shell)) | set(MAKE.findall(inline))
    assert named <= targets, f"{path.name} names make targets the Makefile lacks: {named - targets}"


@pytest.mark.parametrize("path", DOCS, ids=IDS)
def test_repository_paths_in_shell_blocks_exist(path: Path) -> None:
    missing = [
        f"{block.where}: {found}"
        for block in blocks(path) if block.language in ("bash", "console")
        for found in REPO_PATH.findall(block.code) if not (ROOT / found).exists()
    ]
    assert not missing, missing


@pytest.mark.parametrize("path", DOCS, ids=IDS)
def test_relative_links_lead_somewhere(path: Path) -> None:
    """Links to files and headings (pictures are not checked: some are drawn by other jobs)."""
    broken = []
    for target in LINK.findall(path.read_text()):
        if re.match(r"^[a-z]+:", target):
            continue  # https:, mailto:
        file, _, anchor = target.partition("#")
        resolved = (path.parent / file).resolve() if file else path
        if not resolved.exists():
            broken.append(target)
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            broken.append(target)
    assert not broken, f"{path.name}: broken links {broken}"


@pytest.mark.parametrize("path", DOCS, ids=IDS)
def test_user_documents_speak_of_the_project_not_of_how_it_was_made(path: Path) -> None:
    words = re.findall(r"\b(?:this|previous|last|earlier|next) sessions?\b", path.read_text(), re.I)
    assert not words, f"{path.name}: {words}"


def test_there_is_something_to_check() -> None:
    everything = [b for path in DOCS for b in blocks(path)]
    assert sum(b.language == "python" for b in everything) >= 8
    assert any(b.gpu for b in everything), "no block is marked <!-- gpu -->"
