"""Process-shared POSIX semaphores living inside a shared-memory mapping.

A semaphore is 32 bytes of ``sem_t`` at a fixed offset of a ``MAP_SHARED``
mapping; ``sem_init(pshared=1)`` makes it usable from every process that maps
the segment. glibc implements ``sem_post`` / ``sem_trywait`` with atomics and
enters the kernel (a futex) only to sleep or to wake a sleeper, so an
uncontended post or acquire costs one ctypes call and no system call, and a
blocked waiter sleeps in the kernel at ~0% CPU. ctypes releases the GIL for the
call, so other threads keep running while one waits. (A ping-pong through two
of them costs what one through a pipe or an eventfd does: docs/design-notes.md,
"Numbers behind the code".)

The C fast path. When the extension ``cgraph.channels._fastpath`` is built
(setup.py) it is loaded here, the lowest layer of the channel, and post /
try-acquire / acquire call its C functions instead of ctypes (the wait sleeps
with the GIL released, as ctypes does).
``fastpath`` is that module, or None: not built, failed to import, or
``CGRAPH_PURE_PYTHON=1`` (read once, at import) asks for the ctypes path.
shm_channel.py's Fast endpoints build the channel's own C hot path on the same module.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from cgraph._log import logger

if TYPE_CHECKING:
    from cgraph.channels import _fastpath

    class FastPath(Protocol):
        """The C extension module ``_fastpath`` (typed in ``_fastpath.pyi``), as used here
        and by shm_channel.py's Fast endpoints."""

        MISS: object
        WAIT_FAILED: int
        DECODE: int
        Endpoint: type[_fastpath.Endpoint]

        def sem_post(self, address: int, /) -> int: ...
        def sem_trywait(self, address: int, /) -> int: ...
        def sem_wait(self, address: int, deadline_ns: int | None, poll_ns: int,
                     should_stop: Callable[[], bool] | None, /) -> int: ...

SEM_SIZE = 32  # sizeof(sem_t) on 64-bit glibc
_CLOCK_MONOTONIC = time.CLOCK_MONOTONIC
_NS = 1_000_000_000

_libc = ctypes.CDLL("libc.so.6", use_errno=True)
_sem_init = _libc.sem_init
_sem_init.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint]
_sem_post = _libc.sem_post
_sem_post.argtypes = [ctypes.c_void_p]
_sem_trywait = _libc.sem_trywait
_sem_trywait.argtypes = [ctypes.c_void_p]
_sem_clockwait = _libc.sem_clockwait  # glibc >= 2.30: waits on CLOCK_MONOTONIC
_sem_clockwait.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p]
_sem_getvalue = _libc.sem_getvalue
_sem_getvalue.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_int)]


def _load_fastpath() -> FastPath | None:
    """The C extension, or None (with a debug line saying why) for the pure-Python path."""
    if os.environ.get("CGRAPH_PURE_PYTHON", "") not in ("", "0"):
        logger.debug("CGRAPH_PURE_PYTHON is set: shm channels run in pure Python")
        return None
    try:
        from cgraph.channels import _fastpath
    except Exception as exc:  # not built (ImportError), or built for another libc / Python
        logger.debug("C fast path unavailable (%s): shm channels run in pure Python", exc)
        return None
    return _fastpath


fastpath = _load_fastpath()


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class Semaphore:
    """One process-shared semaphore at ``address`` inside a live mapping.

    ``anchor`` is any object that keeps the mapping alive (the ctypes view of
    the mmap): the semaphore must never outlive the memory it points into.
    """

    __slots__ = (
        "_address", "_ptr", "_anchor", "_until", "_until_ref", "post_fast", "try_acquire_fast"
    )  # fmt: skip

    def __init__(self, address: int, anchor: object) -> None:
        self._address = address
        self._ptr = ctypes.c_void_p(address)
        self._anchor = anchor
        self._until = _Timespec()  # reused: one thread waits per semaphore object
        self._until_ref = ctypes.byref(self._until)
        # C-level callables for the channels' hot paths (no Python frame): return
        # 0 on success. sem_post only fails on a corrupt semaphore or overflow
        # (the C version raises OSError then, ctypes returns -1).
        if fastpath is not None:
            self.post_fast = functools.partial(fastpath.sem_post, address)
            self.try_acquire_fast = functools.partial(fastpath.sem_trywait, address)
        else:
            self.post_fast = functools.partial(_sem_post, self._ptr)
            self.try_acquire_fast = functools.partial(_sem_trywait, self._ptr)

    def init(self, value: int) -> None:
        """Initialise in place (once, by the segment's creator, before sharing it)."""
        if _sem_init(self._ptr, 1, value) != 0:
            raise OSError(ctypes.get_errno(), "sem_init failed")

    def post(self) -> None:
        """Add one token; wakes one sleeper if there is one."""
        if self.post_fast() != 0:
            raise OSError(ctypes.get_errno(), "sem_post failed")

    def try_acquire(self) -> bool:
        """Take a token if one is there, without blocking or entering the kernel."""
        return bool(self.try_acquire_fast() == 0)

    def value(self) -> int:
        """Current token count (for tests and debugging; racy by nature)."""
        out = ctypes.c_int()
        _sem_getvalue(self._ptr, ctypes.byref(out))
        return out.value

    def acquire(
        self, deadline_ns: int | None, poll_ns: int, should_stop: Callable[[], bool]
    ) -> bool:
        """Take a token, sleeping in the kernel until one comes or time runs out.

        Wakes every ``poll_ns`` to ask ``should_stop()`` (a closed channel), so a
        lost wake-up can delay a waiter by at most one poll period, never hang it.

        Args:
            deadline_ns: ``time.monotonic_ns()`` value to give up at; None waits forever.
            poll_ns: longest single sleep.
            should_stop: checked before every sleep; True ends the wait.

        Returns:
            True with a token taken; False on deadline or when ``should_stop()``.
        """
        if fastpath is not None:  # the same loop in C, without the GIL between checks
            return bool(fastpath.sem_wait(self._address, deadline_ns, poll_ns, should_stop) == 0)
        if _sem_trywait(self._ptr) == 0:
            return True
        ts = self._until
        while not should_stop():
            now = time.monotonic_ns()
            if deadline_ns is not None and now >= deadline_ns:
                return False
            until = now + poll_ns if deadline_ns is None else min(deadline_ns, now + poll_ns)
            ts.tv_sec, ts.tv_nsec = divmod(until, _NS)
            if _sem_clockwait(self._ptr, _CLOCK_MONOTONIC, self._until_ref) == 0:
                return True
            err = ctypes.get_errno()
            if err not in (errno.ETIMEDOUT, errno.EINTR):
                raise OSError(err, "sem_clockwait failed")
        return False
