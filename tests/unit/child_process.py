"""Run a function in a child process and get its value or its error back (channel tests)."""

from __future__ import annotations

import multiprocessing as mp
from typing import Any

FORK = mp.get_context("fork")


def run(target: Any, *args: Any, ctx: Any = FORK) -> tuple[Any, Any]:
    """Start ``target(*args)`` in a child; ``finish`` waits for what it returned."""
    out = ctx.Queue()
    proc = ctx.Process(target=_report, args=(out, target, *args), daemon=True)
    proc.start()
    return proc, out


def finish(proc: Any, out: Any, timeout: float = 20) -> Any:
    """The child's return value; fails the test with its error (or a timeout)."""
    try:
        status, value = out.get(timeout=timeout)
    finally:
        proc.join(timeout if proc.is_alive() else None)
        if proc.is_alive():
            proc.kill()
    assert status == "ok", value
    return value


def _report(out: Any, target: Any, *args: Any) -> None:
    try:
        out.put(("ok", target(*args)))
    except BaseException as exc:  # the parent asserts on it
        out.put(("err", f"{type(exc).__name__}: {exc}"))
