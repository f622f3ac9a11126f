"""Types of the C extension _fastpath.c (the shared-memory channel's hot path)."""

from collections.abc import Callable
from typing import final

from cgraph._boundary import UserValue

LAYOUT: dict[str, int]
MISS: object
FALLBACK: int
WAIT_FAILED: int
CLOSED: int
DECODE: int

def sem_post(address: int, /) -> int: ...
def sem_trywait(address: int, /) -> int: ...
def sem_wait(
    address: int, deadline_ns: int | None, poll_ns: int, should_stop: Callable[[], bool] | None, /
) -> int: ...
@final
class Endpoint:
    @property
    def status(self) -> int: ...
    @property
    def holding(self) -> int: ...
    @property
    def reader(self) -> int: ...
    def __init__(
        self,
        words: memoryview,
        gens: list[int],
        views: list[memoryview | None],
        reader: int,
        num_readers: int,
        max_inflight: int,
        sem_offset: int,
        poll_ns: int,
    ) -> None: ...
    def write(self, value: UserValue, timeout: float | None = None, /) -> object: ...
    def read(self, timeout: float | None = None, copy: bool = False, /) -> UserValue: ...
    def release(self) -> None: ...
    def forget(self) -> None: ...
    def detach(self) -> None: ...
