"""Values to and from a channel slot: pickle protocol 5 with out-of-band buffers.

The writer pickles a value; every large contiguous buffer inside it (numpy
arrays, CPU torch tensors, bytearrays) comes out of the pickler as a separate
buffer instead of being copied into the pickle bytes. ``pack_into`` copies the
pickle bytes and each buffer once, straight into the slot; ``loads`` rebuilds
the value with each buffer as a view into the slot (no copy).

Slot layout (all integers little-endian u64)::

    0    pickle length P, buffer count K
    16   K entries: offset, length, flags         (flags bit 0: writable)
    16+24K          pickle bytes (P)
    aligned to 64   buffer 0 ... buffer K-1, each starting on a 64-byte boundary

Zero-copy views and mutability. numpy arrays come back READ-ONLY: several
readers see the same slot, and the writer reuses it after every reader
releases, so an in-place write would corrupt a sibling's value (numpy enforces
this; it is also what Ray's object store does). torch has no read-only
tensors, and ``torch.from_numpy`` of a read-only array warns, so CPU tensors
are rebuilt with ``torch.frombuffer`` over a writable view: treat them as
read-only anyway and ``clone()`` before mutating or keeping them past
``release()``.

Neither numpy nor torch is imported here: a reducer is active only when its
module is already in ``sys.modules`` (a value cannot hold an array otherwise).
numpy arrays of plain dtypes travel as (buffer, dtype string, shape, order),
about 3x cheaper per array than numpy's own reducer; strided arrays are made
contiguous first (one copy, still read zero-copy). Tensors travel as a flat
uint8 view of their bytes plus (dtype, shape), which covers dtypes numpy lacks
(bfloat16, float8, ...). Other objects use their own reducers, through Ray's
cloudpickle once Ray is loaded (``pickler_base``): classes and functions of a
driver script's ``__main__`` travel by value, as through Ray. Small plain
values (int, str, ...) take a fast path: one ``pickle.dumps``, no buffers.

CUDA tensors on a shared-memory or socket edge (or in a driver output) travel
through host memory, as in Ray Compiled Graphs: the writer copies each to the
host (``Tensor.cpu``, the one CUDA call here), and the reader rebuilds it on its
current CUDA device where CUDA is available, else on the CPU: a driver without
a GPU gets CPU tensors and never starts CUDA. Use a communicator edge
(``with_tensor_transport("nccl")``) to keep them on the device.

Exceptions round-trip through pickle. One that cannot be pickled (a lock in an
attribute, a local class) is replaced by a ``RuntimeGraphError`` (or a
``TaskError`` without its cause) carrying its type, message and traceback
text, so an error value always reaches the reader.
"""

from __future__ import annotations

import functools
import io
import pickle
import struct
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, cast

from cgraph.errors import RuntimeGraphError, TaskError

if TYPE_CHECKING:
    from _pickle import _ReducedType
    from types import NotImplementedType

    import numpy as np
    import torch

    from cgraph._boundary import UserValue

ALIGN = 64
WRITABLE = 1
EXTERNAL = 2  # entry flag: the buffer is in the origin's segment, not in this slot
FORWARDED = 1 << 62  # in the buffer count word: an origin follows the pickle bytes
_HEAD = struct.Struct("<QQ")
_ENTRY = struct.Struct("<QQQ")
_PLAIN = frozenset({int, float, complex, bool, str, bytes, type(None)})
_CONTAINERS = frozenset({tuple, list, dict})


@dataclass(slots=True)
class Payload:
    """A pickled value, ready to be copied into a slot of ``nbytes`` bytes.

    A forwarded payload (``forwarded``) leaves some buffers where they are, in
    another channel's slot: their entries say EXTERNAL, with ``offsets[i]`` the
    buffer's place in that slot's data segment, and ``origin`` (written after the
    pickle bytes) names it (see ``shm_channel``'s "Forwarding").
    """

    pickled: bytes
    buffers: Sequence[memoryview]  # raw byte views of the out-of-band buffers
    flags: Sequence[int]
    offsets: Sequence[int]
    nbytes: int  # slot bytes needed
    origin: bytes = b""  # forwarded: the pickled origin of the EXTERNAL buffers


def forwarded(payload: Payload, external: dict[int, int], origin: bytes) -> Payload:
    """``payload`` with buffer ``i`` left in place at ``external[i]`` of the origin's data
    segment (an EXTERNAL entry, nothing copied); the other buffers are copied as usual."""
    flags = [flag | EXTERNAL if i in external else flag for i, flag in enumerate(payload.flags)]
    pos = _HEAD.size + _ENTRY.size * len(payload.buffers) + len(payload.pickled) + 8 + len(origin)
    offsets = []
    for i, buf in enumerate(payload.buffers):
        if i in external:
            offsets.append(external[i])
            continue
        pos = -(-pos // ALIGN) * ALIGN
        offsets.append(pos)
        pos += buf.nbytes
    return Payload(payload.pickled, payload.buffers, flags, offsets, pos, origin)


def dumps(value: UserValue) -> Payload:
    """Pickle ``value``; its large buffers stay where they are until ``pack_into``.

    Raises:
        pickle.PicklingError, TypeError, AttributeError: ``value`` is not
            picklable (an exception value never raises: it is replaced).
    """
    if type(value) in _PLAIN or _is_small_plain(value):  # fast path: no buffers, no layout
        pickled = pickle.dumps(value, protocol=5)
        return Payload(pickled, (), (), (), _HEAD.size + len(pickled))
    try:
        pickled, buffers, flags = _pickle(value)
    except Exception as exc:
        if not isinstance(value, BaseException):
            raise
        pickled, buffers, flags = _pickle(_stand_in(value, exc))
    pos = _HEAD.size + _ENTRY.size * len(buffers) + len(pickled)
    offsets = []
    for buf in buffers:
        pos = -(-pos // ALIGN) * ALIGN
        offsets.append(pos)
        pos += buf.nbytes
    return Payload(pickled, buffers, flags, offsets, pos)


def _is_small_plain(value: UserValue, depth: int = 2) -> bool:
    """A short tuple/list/dict of plain scalars (e.g. execute's ``(args, kwargs)``).

    Plain loops, not ``all(genexpr)``: this runs on every write of a small value.
    """
    kind = type(value)
    if kind in _PLAIN:
        return True
    if depth == 0 or kind not in _CONTAINERS or len(value) > 8:
        return False
    if kind is dict:
        for k, v in value.items():
            if type(k) is not str or (type(v) not in _PLAIN and not _is_small_plain(v, depth - 1)):
                return False
        return True
    for v in value:
        if type(v) not in _PLAIN and not _is_small_plain(v, depth - 1):
            return False
    return True


def pack_into(payload: Payload, dest: memoryview) -> None:
    """Write ``payload`` at the start of ``dest`` (at least ``payload.nbytes`` long)."""
    count = len(payload.buffers)
    if not count:
        dest[: payload.nbytes] = _HEAD.pack(len(payload.pickled), 0) + payload.pickled
        return
    origin = payload.origin
    _HEAD.pack_into(dest, 0, len(payload.pickled), count | (FORWARDED if origin else 0))
    for i, (buf, off, flag) in enumerate(
        zip(payload.buffers, payload.offsets, payload.flags, strict=True)
    ):
        _ENTRY.pack_into(dest, _HEAD.size + _ENTRY.size * i, off, buf.nbytes, flag)
    start = _HEAD.size + _ENTRY.size * count
    dest[start : start + len(payload.pickled)] = payload.pickled
    if origin:
        at = start + len(payload.pickled)
        struct.pack_into("<Q", dest, at, len(origin))
        dest[at + 8 : at + 8 + len(origin)] = origin
    for buf, off, flag in zip(payload.buffers, payload.offsets, payload.flags, strict=True):
        if not flag & EXTERNAL:
            dest[off : off + buf.nbytes] = buf  # the one copy of each array


def payload_chunks(payload: Payload) -> list[memoryview | bytes]:
    """The bytes ``pack_into`` lays out, as pieces a stream sends in order (``sendmsg``).

    ``b"".join(payload_chunks(p))`` equals the first ``p.nbytes`` bytes that
    ``pack_into`` writes into a zeroed slot: head, entries and pickle bytes, then
    each out-of-band buffer (a view, not a copy) after its zero padding.
    """
    count = len(payload.buffers)
    head = [_HEAD.pack(len(payload.pickled), count)]
    for buf, off, flag in zip(payload.buffers, payload.offsets, payload.flags, strict=True):
        head.append(_ENTRY.pack(off, buf.nbytes, flag))
    chunks: list[memoryview | bytes] = [b"".join(head), payload.pickled]
    pos = _HEAD.size + _ENTRY.size * count + len(payload.pickled)
    for buf, off in zip(payload.buffers, payload.offsets, strict=True):
        if off > pos:
            chunks.append(bytes(off - pos))
        chunks.append(buf)
        pos = off + buf.nbytes
    return chunks


def has_buffers(src: memoryview) -> bool:
    """Whether the value packed at the start of ``src`` has out-of-band buffers."""
    return bool(_HEAD.unpack_from(src, 0)[1])


def origin_of(src: memoryview) -> bytes | None:
    """The pickled origin of a forwarded value packed at the start of ``src`` (None: not one)."""
    plen, count = _HEAD.unpack_from(src, 0)
    if not count & FORWARDED:
        return None
    at = _HEAD.size + _ENTRY.size * (count & ~FORWARDED) + plen
    (length,) = struct.unpack_from("<Q", src, at)
    return bytes(src[at + 8 : at + 8 + length])


def loads(src: memoryview, writable: bool = False, external: memoryview | None = None,
          copy: bool = False) -> UserValue:
    """Rebuild the value packed at the start of ``src`` (a writable byte view).

    Out-of-band buffers become views into ``src`` (an EXTERNAL one into
    ``external``, the origin's data segment): valid while that memory is mapped,
    and their contents only until the slot is reused. ``writable``: ``src`` is a
    private copy, so every array may be written (the driver's results); ``copy``:
    every buffer is copied first (the value outlives the slots).
    """
    plen, count = _HEAD.unpack_from(src, 0)
    count &= ~FORWARDED
    start = _HEAD.size + _ENTRY.size * count
    if count == 0:
        return pickle.loads(src[start : start + plen])
    readonly = src if writable else src.toreadonly()
    buffers: list[memoryview] = []
    for i in range(count):
        off, length, flag = _ENTRY.unpack_from(src, _HEAD.size + _ENTRY.size * i)
        if flag & EXTERNAL:
            if external is None:
                raise RuntimeGraphError("a forwarded value arrived without its origin's memory (a cgraph bug)")
            base = external if flag & WRITABLE else external.toreadonly()
        else:
            base = src if flag & WRITABLE else readonly
        view = base[off : off + length]
        buffers.append(memoryview(bytearray(view)) if copy else view)
    return pickle.loads(src[start : start + plen], buffers=buffers)


# --------------------------------------------------------------------------- pickling
_local = threading.local()


_CLOUD: type | None = None

if TYPE_CHECKING:
    PicklerMixin = pickle.Pickler
else:
    PicklerMixin = object  # a mixin's real Pickler base comes from on_base, at run time


def pickler_base() -> type:
    """The Pickler values are pickled with: Ray's cloudpickle once Ray is loaded (in
    every process of a compiled graph), so classes and functions of a driver script's
    ``__main__``, local ones and lambdas travel by value, as they do through Ray; plain
    pickle in a process without Ray."""
    global _CLOUD
    if _CLOUD is None:
        if "ray" not in sys.modules:
            return pickle.Pickler
        from ray import cloudpickle

        _CLOUD = cloudpickle.Pickler
    return _CLOUD


@functools.cache
def on_base(mixin: type, base: type) -> type:
    """``mixin`` (a Pickler's own methods) over ``base``; ``_base_override`` is the
    base's ``reducer_override`` (cloudpickle's), for the mixin's to fall back on."""
    override = getattr(base, "reducer_override", None)
    return type(mixin.__name__, (mixin, base),
                {"_base_override": None if override is None else staticmethod(override)})


def _pickle(value: UserValue) -> tuple[bytes, list[memoryview], list[int]]:
    # One pickler per thread, reused: building one costs ~3 us, a whole small hop.
    pickler: _OutOfBandPickler | None = getattr(_local, "pickler", None)
    base = pickler_base()
    if pickler is None or pickler.busy or not isinstance(pickler, base):  # busy: re-entered
        pickler = _local.pickler = cast(_OutOfBandPickler, on_base(_OutOfBandPickler, base)(io.BytesIO()))
    pickler.start()
    try:
        pickler.dump(value)
        return pickler.file.getvalue(), pickler.buffers, pickler.flags
    finally:
        pickler.forget()


class _OutOfBandPickler(PicklerMixin):
    """Protocol-5 pickler with lean reducers for numpy arrays and CPU torch tensors
    (a mixin: ``on_base`` puts it over ``pickler_base()``).

    numpy's own protocol-5 reducer pickles the dtype object and costs ~3x more
    per array than this one, which matters for the per-value overhead.
    """

    _base_override: Callable[[pickle.Pickler, UserValue], _ReducedType] | None = None

    def __init__(self, file: io.BytesIO) -> None:
        super().__init__(file, protocol=5, buffer_callback=self._on_buffer)
        self.file = file
        self.busy = False
        self._ndarray: type | None = None
        self._tensor: type | None = None
        self._writable: dict[int, pickle.PickleBuffer] = {}  # kept alive: ids stay unique
        self.buffers: list[memoryview] = []
        self.flags: list[int] = []

    def start(self) -> None:
        self.busy = True
        numpy, torch = sys.modules.get("numpy"), sys.modules.get("torch")
        self._ndarray = numpy.ndarray if numpy is not None else None
        self._tensor = torch.Tensor if torch is not None else None

    def forget(self) -> None:
        """Drop every reference to the last value, so the pickler keeps nothing alive."""
        self.file.seek(0)
        self.file.truncate()
        self.clear_memo()
        globals_ref = getattr(self, "globals_ref", None)  # cloudpickle's, per dump
        if globals_ref:
            globals_ref.clear()
        self._writable = {}
        self.buffers, self.flags = [], []
        self.busy = False

    def reducer_override(self, obj: UserValue) -> _ReducedType | NotImplementedType:
        kind = type(obj)  # exact types: subclasses (Parameter, matrix) keep their reducers
        if kind is self._ndarray and obj.dtype.kind in _FLAT_KINDS:
            order = "F" if obj.flags.f_contiguous and not obj.flags.c_contiguous else "C"
            if not (obj.flags.c_contiguous or obj.flags.f_contiguous):
                obj = obj.copy()  # strided: one copy here beats pickling it in band
            buf = pickle.PickleBuffer(obj)
            return _rebuild_array, (buf, obj.dtype.str, obj.shape, order)
        if kind is self._tensor and obj.layout is _strided():
            device = obj.device.type
            if obj.is_quantized or device not in ("cpu", "cuda"):
                return NotImplemented  # type: ignore[no-any-return]  # mypy: Any outside operator methods
            if device == "cuda":
                obj = obj.detach().cpu()  # CUDA: device to host, see the module docstring
            flat = obj.detach().resolve_conj().resolve_neg().contiguous().reshape(-1)
            buf = pickle.PickleBuffer(flat.view(sys.modules["torch"].uint8).numpy())
            self._writable[id(buf)] = buf
            if device == "cuda":
                return _rebuild_cuda_tensor, (buf, obj.dtype, tuple(obj.shape), obj.requires_grad)
            return _rebuild_tensor, (buf, obj.dtype, tuple(obj.shape), obj.requires_grad)
        base = self._base_override
        return NotImplemented if base is None else base(self, obj)

    def _on_buffer(self, pb: pickle.PickleBuffer) -> bool:
        self.buffers.append(pb.raw())
        self.flags.append(WRITABLE if id(pb) in self._writable else 0)
        return False  # out of band


_FLAT_KINDS = frozenset("biufcSU")  # dtype.str describes them fully; they export buffers


def _strided() -> object:
    return sys.modules["torch"].strided


def _rebuild_array(buf: memoryview | bytes | bytearray, dtype: str, shape: tuple[int, ...],
                   order: Literal["C", "F"]) -> np.ndarray:
    import numpy

    return numpy.frombuffer(buf, dtype).reshape(shape, order=order)


def _rebuild_tensor(buf: memoryview | bytes | bytearray, dtype: torch.dtype, shape: tuple[int, ...],
                    requires_grad: bool) -> torch.Tensor:
    import torch

    if memoryview(buf).nbytes == 0:
        tensor = torch.empty(shape, dtype=dtype)
    else:
        tensor = torch.frombuffer(buf, dtype=dtype).reshape(shape)
    return tensor.requires_grad_() if requires_grad else tensor


def _rebuild_cuda_tensor(buf: memoryview | bytes | bytearray, dtype: torch.dtype, shape: tuple[int, ...],
                         requires_grad: bool) -> torch.Tensor:
    """A tensor written from a GPU: on this process's current CUDA device if it has
    CUDA, else on the CPU (then a view of the slot, as any CPU tensor)."""
    host = _rebuild_tensor(buf, dtype, shape, False)
    tensor = host.cuda() if has_cuda() else host  # CUDA: host to device
    return tensor.requires_grad_() if requires_grad else tensor


@functools.lru_cache(maxsize=1)
def has_cuda() -> bool:
    """Whether a tensor written from a GPU lands on a GPU here (asked once), as in Ray
    Compiled Graphs: in an actor only where Ray gave it GPUs (``ray.get_gpu_ids()``: an
    actor without ``num_gpus`` may still see the node's GPUs, but gets the tensor on the
    CPU); in the driver wherever torch sees CUDA."""
    import torch

    if not torch.cuda.is_available():
        return False
    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized() or ray.get_runtime_context().get_actor_id() is None:
        return True  # the driver (or no Ray): its own choice of device
    return bool(ray.get_gpu_ids())


def _stand_in(exc: BaseException, why: Exception) -> BaseException:
    import traceback

    text = "".join(traceback.format_exception(exc))
    if isinstance(exc, TaskError):
        return TaskError(
            exc.args[0] if exc.args else "",
            actor=exc.actor,
            method=exc.method,
            execution_index=exc.execution_index,
            traceback_str=exc.traceback_str or text,
        )
    return RuntimeGraphError(
        f"{type(exc).__qualname__}: {exc} (the exception could not be pickled: {why!r}; "
        f"make it picklable to keep its type)\n{text}"
    )
