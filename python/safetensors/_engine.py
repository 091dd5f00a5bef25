"""The Python side of the C++ loading engine (include/safetensors/engine.h): the one accelerated path.

The engine reads a plan of data-buffer ranges with a pool of reader threads (positional reads) into slabs of
one process-wide, bounded slab pool. What needs a framework comes from a ``DeviceCopier``: host memory for the
slabs (page-locked where the framework has it), the copy out of a slab to the device, and an event that says
when that copy is done. The loop here feeds the engine's ``CopyQueue``, which returns a slab to the pool only
once the copies out of it completed.
``TorchCopier`` serves every device torch knows (``load_file(device=...)``, ``get_tensors()``,
``load_model(device=...)``, ``prefetch`` onto accelerators and the distributed loader's reads); paddle's copier
is in ``safetensors/paddle.py``.

Host staging memory is the pool's capacity (``set_staging_capacity``; default the binding's
``DEFAULT_STAGING_BYTES``) whatever the model size, shared by every concurrent load in the process, and
returned once no load is running.

The pool's allocator is this module's only while nobody else installed one: a load installs it when the pool
has the default allocator (or this module's), and leaves another caller's allocator in place. Slabs that are
not the copying framework's memory (another allocator's), or that torch could not pin, are copied from
synchronously, as pageable memory; ``staging_stats()`` counts those copies and the ``safetensors`` logger says
so at debug level.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import threading
from functools import partial
from typing import Any, Callable, ContextManager, Dict, List, Optional, Protocol, Sequence, Tuple

from . import _safetensors_cpp as _cpp

#: Reader threads per load (tests lower it to make slab order deterministic).
READER_THREADS = _cpp.engine.DEFAULT_READER_THREADS


def set_staging_capacity(nbytes: int) -> None:
    """The most host memory the engine's slab pool holds at once (default ``_safetensors_cpp.engine.DEFAULT_STAGING_BYTES``,
    or the environment's ``SAFETENSORS_STAGING_BYTES``), for every load of the process together."""
    _cpp.engine.slab_pool_set_capacity(int(nbytes))


if os.environ.get("SAFETENSORS_STAGING_BYTES"):
    set_staging_capacity(int(os.environ["SAFETENSORS_STAGING_BYTES"]))


class DeviceCopier(Protocol):
    """How one framework moves staged bytes to one device. Events are objects with ``query()`` and
    ``synchronize()`` (torch's and paddle's events both are)."""

    #: The framework whose slab memory ``copy`` receives as an owner (see ``allocate``).
    framework: str

    @staticmethod
    def allocate(size: int) -> Tuple[int, Any]:
        """Host memory for one slab of the pool, page-locked where the framework can: ``(address, owner)``,
        the owner keeping the memory alive until the pool frees it."""

    def context(self) -> ContextManager[Any]:
        """Entered around a whole load (makes the device current)."""

    def copy(self, dst: Any, offset: int, size: int, address: int, slab: Optional[Tuple[Any, int]]) -> None:
        """Issues the copy of the ``size`` bytes at host ``address`` into bytes ``[offset, offset + size)`` of
        the job's destination ``dst``. ``slab`` is ``(owner, start)`` when the bytes lie in memory this
        framework's ``allocate`` made (at ``start`` in it), else None: another allocator's memory, to be
        copied by address."""

    def record(self) -> Optional[Any]:
        """An event completing once every copy issued so far completed, or None when they already have."""


# The slab memory of the pool's allocator, by address: (framework, owner). The pool has one allocator at a
# time, that of the framework whose load started last; slabs another framework allocated are copied by address.
_slabs: Dict[int, Tuple[str, Any]] = {}
_allocator_lock = threading.Lock()
_allocator_framework: Optional[str] = None
# The pool's allocator_changes right after this module last installed its allocator (None: never): while the
# pool still reports that count, its allocator is ours.
_installed_at: Optional[int] = None
# Copies out of slabs that were not the copying framework's memory / torch slabs torch could not pin: both run
# synchronously, from pageable memory.
_fallbacks = {"foreign_slab_copies": 0, "pageable_slab_copies": 0}
_log = logging.getLogger("safetensors")


def _alloc(copier: type, size: int) -> int:
    address, owner = copier.allocate(size)
    _slabs[address] = (copier.framework, owner)
    return address


def _free(address: int, size: int) -> None:
    _slabs.pop(address, None)


def _use_allocator(copier: DeviceCopier) -> bool:
    """Slabs allocated from now on come from ``copier``'s framework (slabs in use keep their maker) -- unless
    another caller has installed an allocator of its own on the pool, which is left in place. True when the
    pool's allocator is ours. An allocator installed concurrently with this call is seen by the next load."""
    global _allocator_framework, _installed_at
    with _allocator_lock:
        stats = _cpp.engine.slab_pool_stats()
        ours = _installed_at is not None and stats["allocator_changes"] == _installed_at
        if not ours and stats["custom_allocator"]:
            _log.debug("safetensors: the staging slab pool's allocator is not safetensors' (another caller "
                       "installed one); accelerator loads copy from its slabs synchronously, as pageable memory")
            return False
        if not ours or _allocator_framework != copier.framework:
            _cpp.engine.slab_pool_set_allocator(partial(_alloc, type(copier)), _free)
            _allocator_framework = copier.framework
            _installed_at = _cpp.engine.slab_pool_stats()["allocator_changes"]
        return True


def host_view(address: int, size: int) -> memoryview:
    """The ``size`` bytes at ``address`` (memory the engine lends), as a writable memoryview."""
    return memoryview((ctypes.c_ubyte * size).from_address(address)).cast("B")


# The seams the negative-control tests replace: whether a device event has completed, and waiting for one.
def _done(event: Any) -> bool:
    return event.query()


def _await(event: Any) -> None:
    event.synchronize()


Job = Tuple[Any, int, int]  # (destination: 1-d bytes of device memory, begin, end) in data-buffer offsets


def stream_to_device(
    file: Any,
    jobs: Sequence[Job],
    device: Any,
    on_piece: Optional[Callable[[int], None]] = None,
    stop: Optional[threading.Event] = None,
    threads: Optional[int] = None,
    copier: Optional[DeviceCopier] = None,
    names: Optional[Sequence[str]] = None,
) -> None:
    """Fills each job's destination (``end - begin`` bytes of device memory) with those data-buffer bytes of
    ``file``, through ``copier`` (default: a TorchCopier for the ``torch.device`` ``device``). ``on_piece(i)``
    runs (on this thread) once job i's bytes are on the device (its copies completed: the tensor is ready on
    any stream). ``stop`` set: the load stops early. Raises the readers' error (a short read names the file and
    the tensor: ``names[i]`` is job i's tensor, for the messages) after waiting for every copy already issued.
    """
    if not jobs:
        return
    copier = copier if copier is not None else TorchCopier(device)
    _use_allocator(copier)
    foreign = 0  # copies out of slabs that are not copier's framework's memory
    plan = [(names[i] if names else "", begin, end, None) for i, (_, begin, end) in enumerate(jobs)]
    prefetcher = _cpp.engine.Prefetcher(file, plan, threads=threads or READER_THREADS)
    # The engine's CopyQueue returns each slab to the pool once the copy out of it completed (its event, which
    # _done polls and _await waits for), and reports the jobs whose last copy completed.
    copies = _cpp.engine.CopyQueue(prefetcher, _done, _await)
    try:
        with copier.context():
            while stop is None or not stop.is_set():
                event, landed = copies.next()
                _report(landed, on_piece)
                if event.kind == "end":
                    break
                if event.kind == "timeout":
                    continue
                piece = event.piece if event.piece_done else -1
                if not event.size:  # a zero-size piece: nothing to copy
                    copies.add(None, event.slab, piece)
                    continue
                # By address: a slab is ours exactly while it is one of our live slabs (_free drops it).
                slab = _slabs.get(event.slab_address)
                own = slab is not None and slab[0] == copier.framework
                if not own:  # another allocator's memory: the copier copies it by address, synchronously
                    foreign += 1
                copier.copy(jobs[event.piece][0], event.offset, event.size, event.address,
                            (slab[1], event.address - event.slab_address) if own else None)
                copies.add(copier.record(), event.slab, piece)
            if stop is not None and stop.is_set():
                prefetcher.cancel()
        _report(copies.finish(), on_piece)
    finally:
        copies.close()  # on the way out of an error: waits for the copies in flight before their slabs go back
        prefetcher.close()
    if foreign:
        _count_fallback("foreign_slab_copies", foreign)


def _report(landed: List[int], on_piece: Optional[Callable[[int], None]]) -> None:
    if on_piece is not None:
        for piece in landed:
            on_piece(piece)


def _count_fallback(kind: str, count: int = 1) -> None:
    with _allocator_lock:
        _fallbacks[kind] += count
    if kind == "foreign_slab_copies":
        _log.debug("safetensors: %d staged copies came from another allocator's slabs; they ran synchronously "
                   "from pageable memory", count)
    else:
        _log.debug("safetensors: a staging slab torch could not pin was copied from synchronously")


def fill(file: Any, jobs: Sequence[Job], device: Any, copier: Optional[DeviceCopier] = None,
         names: Optional[Sequence[str]] = None) -> None:
    """:func:`stream_to_device` for a whole load: returns once every destination is filled."""
    stream_to_device(file, jobs, device, copier=copier, names=names)


class TorchCopier:
    """Copies to a ``torch.device`` through its torch device module: non-blocking copies from pinned slabs on
    the device's current stream, each followed by an event (cuda, npu, xpu, PrivateUse1 ...)."""

    framework = "torch"

    def __init__(self, device: Any) -> None:
        import torch

        self._torch = torch
        self._device = device
        self._module = torch.get_device_module(device.type)
        self._stream = self._module.current_stream(device)

    @staticmethod
    def allocate(size: int) -> Tuple[int, Any]:
        import torch

        try:
            slab = torch.empty(size, dtype=torch.uint8, device="cpu", pin_memory=True)
        except RuntimeError:  # no pinned-memory allocator for this accelerator: pageable slabs, synchronous copies
            slab = torch.empty(size, dtype=torch.uint8, device="cpu")
        return slab.data_ptr(), slab

    def context(self) -> ContextManager[Any]:
        return self._module.device(self._device) if hasattr(self._module, "device") else contextlib.nullcontext()

    def copy(self, dst: Any, offset: int, size: int, address: int, slab: Optional[Tuple[Any, int]]) -> None:
        if slab is None:
            source, pinned = self._torch.frombuffer(host_view(address, size), dtype=self._torch.uint8), False
        else:
            owner, start = slab
            source, pinned = owner[start : start + size], owner.is_pinned()
            if not pinned:  # torch could not pin it: a synchronous copy
                _count_fallback("pageable_slab_copies")
        # A blocking copy has read its source when copy_ returns; a non-blocking one once its event completed,
        # and only then does the slab go back to the pool.
        dst[offset : offset + size].copy_(source, non_blocking=pinned)

    def record(self) -> Any:
        done = self._module.Event()
        done.record(self._stream)
        return done


class DirectLoad:
    """CPU loads through the engine: reader threads write straight into each destination (no slab, no copy);
    ``next_done()`` returns job indices as they complete. Used by prefetch to the CPU."""

    def __init__(self, file: Any, jobs: Sequence[Tuple[str, int, int, int]], threads: int) -> None:
        # jobs: (tensor name, destination address, begin, end). The name is the engine's: its errors name the
        # tensor, and its dtype gives the byte swap a big-endian host needs.
        self._prefetcher = _cpp.engine.Prefetcher(file, [(name, begin, end, address) for name, address, begin, end in jobs],
                                           threads=threads)
        self._lock = threading.Lock()
        self._closed = False

    def next_done(self) -> Optional[int]:
        """The next completed job, waiting for one (GIL released); None at the end. Raises the readers' error."""
        event = self._prefetcher.next()
        return None if event.kind == "end" else event.piece

    def cancel(self) -> None:
        """Stops the readers (from any thread); wakes a waiting next_done(), which then raises."""
        with self._lock:
            if not self._closed:
                self._prefetcher.cancel()

    def close(self) -> None:
        with self._lock:
            self._closed = True
        self._prefetcher.close()


def reset_staging_peak() -> None:
    """Restarts the pool's ``peak_bytes`` from the bytes it holds now."""
    _cpp.engine.slab_pool_reset_peak()


def staging_stats() -> Dict[str, int]:
    """The slab pool's counters (bytes allocated now and at peak, slabs in use, ...), with ``pool_allocator_ours``
    (1 while the pool's allocator is this module's), and ``foreign_slab_copies`` / ``pageable_slab_copies``:
    copies since the process started that ran synchronously because their slab was not the copying
    framework's memory / was a torch slab that torch could not pin."""
    stats = dict(_cpp.engine.slab_pool_stats())
    with _allocator_lock:
        stats["pool_allocator_ours"] = int(_installed_at is not None and stats["allocator_changes"] == _installed_at)
        stats.update(_fallbacks)
    return stats


__all__: List[str] = ["DeviceCopier", "DirectLoad", "TorchCopier", "fill", "host_view", "set_staging_capacity",
                      "staging_stats", "stream_to_device"]
