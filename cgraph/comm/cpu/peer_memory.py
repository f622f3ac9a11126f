"""Reading a node peer's buffer where it lies: Linux's cross-memory attach (``process_vm_readv``).

Through a shared workspace a byte is written twice on its way to a peer: into the
workspace, then out of it into the peer's buffer. ``process_vm_readv`` copies
from another process's pages straight into this one's, so the "shared" allreduce
can reduce its chunk from its peers' tensors and fetch their results into its
own with one copy each (``algorithms.shared``, above ``CMA_MIN_BYTES``).

The kernel allows it where this process may ptrace the peer: the same user, and
Yama's ``ptrace_scope`` 0 or no Yama (Ubuntu's default 1 allows only a parent
to read its children, which Ray's sibling workers are not), and a seccomp
profile that lets the call through. ``probe`` finds out once per node; where it
fails, the allreduce keeps the workspace.
"""

from __future__ import annotations

import ctypes
import errno
import os

import numpy as np

_libc = ctypes.CDLL(None, use_errno=True)
_readv = getattr(_libc, "process_vm_readv", None)


class _Iovec(ctypes.Structure):
    _fields_ = [("iov_base", ctypes.c_void_p), ("iov_len", ctypes.c_size_t)]


if _readv is not None:
    _readv.restype = ctypes.c_ssize_t
    _readv.argtypes = [ctypes.c_int, ctypes.POINTER(_Iovec), ctypes.c_ulong,
                       ctypes.POINTER(_Iovec), ctypes.c_ulong, ctypes.c_ulong]


def read(pid: int, address: int, out: np.ndarray) -> None:
    """Copy ``out.nbytes`` bytes at ``address`` in process ``pid`` into ``out`` (C-contiguous).

    Raises:
        OSError: the kernel refused (EPERM), the process is gone (ESRCH), the range
            is not mapped there (EFAULT), or the call does not exist here (ENOSYS).
    """
    if out.nbytes == 0:
        return
    if _readv is None:
        raise OSError(errno.ENOSYS, "process_vm_readv is not in this libc")
    local = _Iovec(out.ctypes.data, out.nbytes)
    remote = _Iovec(address, out.nbytes)
    done = _readv(pid, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
    if done != out.nbytes:
        code = ctypes.get_errno() if done < 0 else errno.EIO
        raise OSError(code, f"process_vm_readv from pid {pid}: {os.strerror(code)}"
                      + ("" if done < 0 else f" (read {done} of {out.nbytes} bytes)"))


def probe(pid: int, address: int, expected: int) -> bool:
    """Whether this process may read process ``pid``: the int64 at ``address`` is ``expected``."""
    got = np.zeros(1, dtype=np.int64)
    try:
        read(pid, address, got)
    except OSError:
        return False
    return int(got[0]) == expected
