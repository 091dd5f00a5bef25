"""The torch side of the C++ loading engine (include/safetensors/engine.h): the one accelerated path.

The engine reads a plan of data-buffer ranges with a pool of reader threads (positional reads) into slabs of
one process-wide, bounded slab pool; this module supplies what needs torch -- page-locked slab memory, the
non-blocking device copy out of each slab and its event -- and returns a slab to the pool only once the device
has finished copying out of it. ``load_file(device=...)``, ``get_tensors()``, ``load_model(device=...)``,
``prefetch`` onto accelerators and the distributed loader's reads all go through :func:`stream_to_device`.

Host staging memory is the pool's capacity (``set_staging_capacity``, default 256 MiB) whatever the model
size, shared by every concurrent load in the process, and returned once no load is running.
"""

from __future__ import annotations

import collections
import contextlib
import os
import threading
from typing import Any, Callable, Deque, Dict, List, Optional, Sequence, Tuple

import torch

from . import _safetensors_cpp as _cpp

#: Reader threads per load (tests lower it to make slab order deterministic).
READER_THREADS = 8

# Slab memory: torch tensors, page-locked where torch offers pinned memory for the accelerator, kept by address
# while the pool holds them.
_slabs: Dict[int, torch.Tensor] = {}
_allocator_lock = threading.Lock()
_allocator_installed = False


def set_staging_capacity(nbytes: int) -> None:
    """The most host memory the engine's slab pool holds at once (default 256 MiB, or the environment's
    ``SAFETENSORS_STAGING_BYTES``), for every load of the process together."""
    _cpp.slab_pool_set_capacity(int(nbytes))


if os.environ.get("SAFETENSORS_STAGING_BYTES"):
    set_staging_capacity(int(os.environ["SAFETENSORS_STAGING_BYTES"]))


def _alloc(size: int) -> int:
    try:
        slab = torch.empty(size, dtype=torch.uint8, device="cpu", pin_memory=True)
    except RuntimeError:  # no pinned-memory allocator for this accelerator: pageable slabs, synchronous copies
        slab = torch.empty(size, dtype=torch.uint8, device="cpu")
    address = slab.data_ptr()
    _slabs[address] = slab
    return address


def _free(address: int, size: int) -> None:
    _slabs.pop(address, None)


def _install_pinned_allocator() -> None:
    """Slabs come from torch (pinned for the current accelerator) from the first accelerated load on."""
    global _allocator_installed
    with _allocator_lock:
        if not _allocator_installed:
            _cpp.slab_pool_set_allocator(_alloc, _free)
            _allocator_installed = True


# The seams the negative-control tests replace: whether a device event has completed, and waiting for one.
def _done(event: Any) -> bool:
    return event.query()


def _await(event: Any) -> None:
    event.synchronize()


Job = Tuple[torch.Tensor, int, int]  # (destination bytes on the device, begin, end) in data-buffer offsets


def stream_to_device(
    file: Any,
    jobs: Sequence[Job],
    device: torch.device,
    on_piece: Optional[Callable[[int], None]] = None,
    stop: Optional[threading.Event] = None,
    threads: Optional[int] = None,
) -> None:
    """Fills each job's destination (a 1-d uint8 view of device memory of ``end - begin`` bytes) with those
    data-buffer bytes of ``file``. ``on_piece(i)`` runs (on this thread) once job i's bytes are on the device
    (its copies completed: the tensor is ready on any stream). ``stop`` set: the load stops early. Raises the
    readers' error (a short read names the file and the tensor) after waiting for every copy already issued.
    """
    if not jobs:
        return
    _install_pinned_allocator()
    module = torch.get_device_module(device.type)
    stream = module.current_stream(device)
    plan = [("", begin, end, None) for _, begin, end in jobs]
    prefetcher = _cpp.Prefetcher(file, plan, threads=threads or READER_THREADS)
    # Copies issued and not known to be complete, in issue order (the stream runs them in that order):
    # (event, slab handle, the job they complete or -1).
    pending: Deque[Tuple[Any, int, int]] = collections.deque()

    def retire(wait: bool) -> None:
        while pending and (wait or _done(pending[0][0])):
            event, slab, piece = pending[0]
            if wait:
                _await(event)
            pending.popleft()
            prefetcher.release(slab)
            if piece >= 0 and on_piece is not None:
                on_piece(piece)
            wait = False  # one forced wait; later copies are polled again

    try:
        with module.device(device) if hasattr(module, "device") else contextlib.nullcontext():
            while stop is None or not stop.is_set():
                retire(False)
                # With copies in flight, wait for the engine only briefly: if every slab is lent to a copy, the
                # readers wait for one, and the oldest copy must be waited for to free it.
                event = prefetcher.next(timeout=0.05 if pending else None)
                if event.kind == "end":
                    break
                if event.kind == "timeout":
                    retire(True)
                    continue
                slab = _slabs.get(event.slab_address)
                dst = jobs[event.piece][0]
                if slab is None:  # not our allocator's memory (another owner installed one): pageable copy
                    source = torch.frombuffer(_cpp_view(event.address, event.size), dtype=torch.uint8)
                    pinned = False
                else:
                    start = event.address - event.slab_address
                    source = slab[start : start + event.size]
                    pinned = slab.is_pinned()
                dst[event.offset : event.offset + event.size].copy_(source, non_blocking=pinned)
                done = module.Event()
                done.record(stream)
                pending.append((done, event.slab, event.piece if event.piece_done else -1))
            if stop is not None and stop.is_set():
                prefetcher.cancel()
    except BaseException:
        # Slabs go back to the pool only once the device stopped reading them, also on the way out of an error.
        try:
            while pending:
                event, slab, _ = pending.popleft()
                _await(event)
                prefetcher.release(slab)
        except BaseException:
            pass
        prefetcher.close()
        raise
    while pending:
        retire(True)
    prefetcher.close()


def _cpp_view(address: int, size: int) -> memoryview:
    import ctypes

    return memoryview((ctypes.c_ubyte * size).from_address(address)).cast("B")


def fill(file: Any, jobs: Sequence[Job], device: torch.device) -> None:
    """:func:`stream_to_device` for a whole load: returns once every destination is filled."""
    stream_to_device(file, jobs, device)


class DirectLoad:
    """CPU loads through the engine: reader threads write straight into each destination (no slab, no copy);
    ``next_done()`` returns job indices as they complete. Used by prefetch to the CPU."""

    def __init__(self, file: Any, jobs: Sequence[Tuple[int, int, int]], threads: int) -> None:
        # jobs: (destination address, begin, end)
        self._prefetcher = _cpp.Prefetcher(file, [("", begin, end, address) for address, begin, end in jobs],
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
    _cpp.slab_pool_reset_peak()


def staging_stats() -> Dict[str, int]:
    """The slab pool's counters (bytes allocated now and at peak, slabs in use, ...)."""
    return dict(_cpp.slab_pool_stats())


__all__: List[str] = ["DirectLoad", "fill", "set_staging_capacity", "staging_stats", "stream_to_device"]
