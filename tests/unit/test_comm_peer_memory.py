"""Reading another process's buffer (``peer_memory``: ``process_vm_readv``)."""

from __future__ import annotations

import errno
import multiprocessing as mp
import os
from typing import Any

import numpy as np
import pytest

from cgraph.comm.cpu import peer_memory


def _holder(pipe: Any) -> None:
    data = np.arange(100_000, dtype=np.float32) * 3
    pipe.send((os.getpid(), data.ctypes.data))
    pipe.recv()  # hold the buffer until the reader is done


def test_a_process_reads_another_ones_buffer_and_nothing_after_it_is_gone() -> None:
    ours, theirs = mp.get_context("fork").Pipe()
    child = mp.get_context("fork").Process(target=_holder, args=(theirs,))
    child.start()
    try:
        pid, address = ours.recv()
        first = int(np.array([0, 3], dtype=np.float32).view(np.int64)[0])  # elements 0 and 1
        if not peer_memory.probe(pid, address, first):
            pytest.skip("this host does not let a process read a sibling's memory (ptrace_scope)")
        out = np.empty(50_000, dtype=np.float32)
        peer_memory.read(pid, address + 4 * 25_000, out)
        assert np.array_equal(out, np.arange(25_000, 75_000, dtype=np.float32) * 3)
    finally:
        ours.send("done")
        child.join(10)
    with pytest.raises(OSError) as gone:
        peer_memory.read(pid, address, np.empty(4, dtype=np.uint8))
    assert gone.value.errno == errno.ESRCH and str(pid) in str(gone.value)
    assert not peer_memory.probe(pid, address, first)


def test_an_address_not_mapped_there_is_refused_and_an_empty_read_is_nothing() -> None:
    with pytest.raises(OSError) as bad:
        peer_memory.read(os.getpid(), 8, np.empty(16, dtype=np.uint8))
    assert bad.value.errno == errno.EFAULT
    assert not peer_memory.probe(os.getpid(), 8, 0)
    peer_memory.read(os.getpid(), 8, np.empty(0, dtype=np.uint8))  # nothing to read: no call


def test_probe_checks_the_value_it_reads() -> None:
    token = np.array([123456789], dtype=np.int64)
    assert peer_memory.probe(os.getpid(), token.ctypes.data, 123456789)
    assert not peer_memory.probe(os.getpid(), token.ctypes.data, 42)
