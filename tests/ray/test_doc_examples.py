"""Every Python block of README.md and docs/*.md runs, on the session's local Ray.

The blocks of one document run in order in one namespace, as a reader would paste them
into one session of Python, in a scratch folder (pictures and traces land there). A block
that raises fails the test and is named by file and line; blocks marked ``<!-- gpu -->``
run only where CUDA is available. tests/doc_blocks.py says how blocks are marked.
"""

from __future__ import annotations

import gc
from pathlib import Path

import pytest

from tests.doc_blocks import ROOT, blocks, documents

RUNNABLE = [p for p in documents() if any(b.language == "python" for b in blocks(p))]


def cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


@pytest.mark.parametrize("path", RUNNABLE, ids=[str(p.relative_to(ROOT)) for p in RUNNABLE])
def test_the_python_blocks_of_a_document_run(path: Path, no_leaks, tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("CGRAPH_VISUALIZE_DIR", str(tmp_path))
    for name in ("CGRAPH_VISUALIZE_SCHEDULE", "CGRAPH_TIMELINE", "CGRAPH_DEBUG"):
        monkeypatch.delenv(name, raising=False)
    # not importable by name, so Ray pickles the blocks' classes by value, as for a script
    namespace: dict[str, object] = {"__name__": f"doc_{path.stem.replace('-', '_')}"}
    ran = 0
    try:
        for block in blocks(path):
            if block.language != "python" or (block.gpu and not cuda_available()):
                continue
            code = compile(block.code, block.where, "exec")
            try:
                exec(code, namespace)  # noqa: S102 - the documentation's own examples
            except BaseException as exc:
                raise AssertionError(f"{block.where}: the block raised {type(exc).__name__}: {exc}") from exc
            ran += 1
    finally:
        namespace.clear()  # drop the blocks' actor handles: Ray ends those actors
        gc.collect()
    if not ran:
        pytest.skip("only blocks marked <!-- gpu --> here, and no CUDA")
