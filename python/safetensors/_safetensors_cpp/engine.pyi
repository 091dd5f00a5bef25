"""
The loading engine (src/engine/): prefetchers, copy queues and the process-wide slab pool.
"""

from collections.abc import Callable
from typing import Any

import safetensors._safetensors_cpp


DEFAULT_READER_THREADS: int = 8

DEFAULT_CHUNK_BYTES: int = 8388608

DEFAULT_STAGING_BYTES: int = 268435456

DEFAULT_SLAB_BYTES: int = 8388608

PREFETCH_MAX_THREADS: int = 64

def tensor_piece(file: safetensors._safetensors_cpp.File, name: str) -> tuple[int, int]:
    """The data-buffer range [begin, end) of a whole tensor."""

def row_piece(file: safetensors._safetensors_cpp.File, name: str, r0: int, r1: int) -> tuple[int, int]:
    """
    The data-buffer range [begin, end) of rows [r0, r1) of a tensor's first dimension (checked: 0-d, range, sub-byte alignment).
    """

class PrefetchEvent:
    """What Prefetcher.next() returns."""

    @property
    def kind(self) -> str:
        """
        'staged' (bytes in a slab), 'direct' (a piece complete), 'end' or 'timeout'.
        """

    @property
    def piece(self) -> int:
        """The piece's position in the plan."""

    @property
    def offset(self) -> int:
        """staged: where the bytes lie in the piece."""

    @property
    def address(self) -> int:
        """staged: the bytes' address in the slab (valid until release(slab))."""

    @property
    def size(self) -> int: ...

    @property
    def slab(self) -> int:
        """staged: the handle to release (0: none)."""

    @property
    def slab_address(self) -> int:
        """
        staged: the slab allocation's start (what the pool's alloc returned); address - slab_address is the bytes' offset in it.
        """

    @property
    def piece_done(self) -> bool:
        """The piece's last chunk (always true for direct)."""

class Prefetcher:
    """
    A plan of data-buffer ranges read in the background (the C++ engine). Each plan item is (tensor name, begin, end, dst): dst an address of end - begin writable bytes (direct) or None (staged: bytes come through slabs of the process-wide pool). May be shared by threads: close() from one makes the others' calls raise.
    """

    def __init__(self, file: safetensors._safetensors_cpp.File, plan: list[tuple[str, int, int, int | None]], threads: int = 8, chunk_bytes: int = 8388608, merge_gap: int = 0, max_slabs: int = 0) -> None: ...

    def next(self, timeout: float | None = None) -> PrefetchEvent:
        """
        Waits (the GIL released) for the next event; raises the readers' error (naming file and tensor).
        """

    def release(self, slab: int) -> None:
        """
        Returns a staged event's slab to the pool, once nothing reads it any more.
        """

    def wait_piece(self, piece: int) -> None:
        """Waits (the GIL released) until direct piece `piece` is complete."""

    def piece_done(self, piece: int) -> bool: ...

    def cancel(self) -> None:
        """
        Stops the readers and wakes every waiter; lent slabs stay valid until released or close().
        """

    def close(self) -> None:
        """
        Cancels, joins the readers and returns every slab. Then every method but close() raises.
        """

    def __enter__(self) -> Prefetcher: ...

    def __exit__(self, arg0: object | None, arg1: object | None, arg2: object | None, /) -> None: ...

    def __len__(self) -> int: ...

    def stats(self) -> dict[str, int]:
        """
        Counters: bytes read, bytes staged/direct, reads, chunks, nanoseconds readers waited for slabs, ...
        """

class CopyQueue:
    """
    The engine's slab rule for copies that complete later than they are issued: each staged event's slab goes back to the Prefetcher once the copy out of it completed. One thread at a time (external synchronization).
    """

    def __init__(self, prefetcher: Prefetcher, done: Callable[[Any], bool], wait: Callable[[Any], None]) -> None:
        """
        done(event) polls a copy's event, wait(event) waits for it; both run on the thread calling next() or finish().
        """

    def add(self, event: Any | None, slab: int, piece: int = -1) -> None:
        """
        Records a copy out of `slab` issued after every earlier one; event None: complete already. `piece`: the piece it completes (the event's piece where piece_done), else -1.
        """

    def next(self) -> tuple[PrefetchEvent, list[int]]:
        """
        Retires completed copies, then waits (the GIL released) for the next event: (event, pieces whose last copy completed). With copies pending it waits briefly, then for the oldest copy ('timeout').
        """

    def finish(self) -> list[int]:
        """Waits for every pending copy: the pieces they completed."""

    def close(self) -> None:
        """
        Waits for every pending copy (errors ignored) and releases its slab. Then every method but close() raises.
        """

def slab_pool_set_capacity(bytes: int) -> None:
    """
    The most bytes the process-wide slab pool allocates at once (default DEFAULT_STAGING_BYTES).
    """

def slab_pool_set_slab_bytes(bytes: int) -> None:
    """
    The size of each slab (a multiple of 4096; default DEFAULT_SLAB_BYTES).
    """

def slab_pool_set_allocator(alloc: Callable[[int], int] | None = None, free: Callable[[int, int], None] | None = None) -> None:
    """
    Slab memory from alloc(size) -> address (0 on failure), returned by free(address, size); both None: the default. They run on reader threads (taking the GIL).
    """

def slab_pool_trim() -> None:
    """Frees every idle slab now."""

def slab_pool_reset_peak() -> None:
    """Restarts the pool's peak_bytes counter from the bytes allocated now."""

def slab_pool_stats() -> dict[str, int]:
    """
    Counters of the process-wide slab pool (bytes allocated now and at peak, nanoseconds readers waited for room in it, slabs in use, ...).
    """
