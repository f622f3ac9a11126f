"""``cgraph.wait``: ``ray.wait`` for compiled refs and futures, of one or several graphs.

    wait(refs, num_returns=2, timeout=5)
        each ref: ready now?                 Outputs.ready(index, deadline=now): reads what
                                             has arrived into the buffer, takes nothing
        fewer than num_returns: block        on the oldest not-ready execution's output
                                             (one graph: until the deadline; several: 10 ms
                                             slices, round the graphs)

Ready means ``get()`` answers at once, with a value or an error (as Ray's).
"""

from __future__ import annotations

import time

from cgraph.runtime.results import (
    CompiledFuture,
    CompiledRef,
    deadline_after,
)

Waitable = CompiledRef | CompiledFuture
"""What ``wait`` takes: a compiled ref or future (of any graph)."""

WAIT_SLICE_S = 0.01
"""How long ``wait`` blocks on one graph's output when the refs span several graphs (it
cannot sleep on all of them at once); with one graph it blocks until the deadline."""


def wait(refs: list[Waitable], *, num_returns: int = 1, timeout: float | None = None,
         fetch_local: bool = True) -> tuple[list[Waitable], list[Waitable]]:
    """``ray.wait`` for compiled refs and futures: wait until ``num_returns`` of them are
    ready (a ``get`` or ``await`` of each answers at once, with a value or an error).

    Args:
        refs: compiled refs or futures, of one or several graphs, each at most once.
        num_returns: how many ready ones to wait for.
        timeout: seconds at most (None: no limit; 0: do not wait).
        fetch_local: accepted for Ray's signature; the results are in the driver already.

    Returns:
        ``(ready, not_ready)``: at most ``num_returns`` ready ones, and the rest, each
        list in the order of ``refs``. A ref is read once: ``wait`` takes no result, it
        only moves arrived results into the graph's buffer for their refs (within
        ``max_buffered_results``, as a ``get`` of a later ref does).

    Raises:
        TypeError: ``refs`` is not a list of compiled refs and futures.
        ValueError: a ref appears twice, ``num_returns`` is out of range, or ``timeout``
            is negative.
    """
    if not isinstance(refs, (list, tuple)):
        raise TypeError(f"wait() expected a list of compiled refs or futures, got {type(refs).__name__}")
    items = list(refs)
    for item in items:
        if not isinstance(item, (CompiledRef, CompiledFuture)):
            raise TypeError(f"wait() expected a list of compiled refs or futures (CompiledDAGRef, "
                            f"CompiledDAGFuture), got an element of type {type(item).__name__}")
    if len({id(item) for item in items}) != len(items):
        raise ValueError("Wait requires a list of unique object refs.")
    if num_returns <= 0:
        raise ValueError(f"Invalid number of objects to return {num_returns}.")
    if num_returns > len(items):
        raise ValueError("num_returns cannot be greater than the number of objects provided to "
                         f"wait ({num_returns} > {len(items)}).")
    if timeout is not None and timeout < 0:
        raise ValueError(f"The 'timeout' argument must be nonnegative. Received {timeout}")
    del fetch_local
    deadline = deadline_after(timeout)
    refs_of = [item._ref if isinstance(item, CompiledFuture) else item for item in items]
    graphs = {id(ref._graph) for ref in refs_of}
    while True:
        now = time.monotonic()
        ready = [i for i, ref in enumerate(refs_of) if ref._ready(now)]
        if len(ready) >= num_returns or (deadline is not None and now >= deadline):
            break
        waiting = min((ref for i, ref in enumerate(refs_of) if i not in ready),
                      key=lambda ref: ref.execution_index)
        until = deadline if len(graphs) == 1 else min(
            now + WAIT_SLICE_S, deadline if deadline is not None else float("inf"))
        waiting._ready(until)  # blocks in the kernel on that graph's next output
    chosen = set(ready[:num_returns])
    return ([items[i] for i in sorted(chosen)],
            [items[i] for i in range(len(items)) if i not in chosen])
