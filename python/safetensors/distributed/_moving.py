"""Step 4 of a distributed load on one rank: walking the schedule, reading this rank's chunks with the native
positional reads and exchanging every chunk it needs over the process group, a window of them in flight.

``read_chunk`` is the read seam (tests replace it to make a rank fail or die mid-load)."""

from __future__ import annotations

import bisect
import collections
import dataclasses
from typing import Any, Deque, List, NamedTuple, Optional, Tuple

import torch
import torch.distributed as dist

from ._group import Group, error_text
from ._schedule import Chunk

__all__ = ["LoadStats", "Mover", "read_chunk"]

#: Chunks in flight per rank (each may hold one staging buffer of chunk_bytes).
WINDOW = 8


@dataclasses.dataclass
class LoadStats:
    """What one rank did in a load; pass one as ``stats=`` to have it filled.

    ``bytes_read`` came from storage (by this rank), ``bytes_sent``/``bytes_received`` went over the process
    group (a broadcast counts once per receiver on the sender), ``bytes_needed`` is what this rank's tensors
    hold (what it would read loading alone), ``bytes_scheduled`` is what the whole group reads (every byte some
    rank needs, once), ``chunks``/``chunks_read`` count the group's chunks and this rank's.
    """

    bytes_read: int = 0
    bytes_sent: int = 0
    bytes_received: int = 0
    bytes_needed: int = 0
    bytes_scheduled: int = 0
    chunks: int = 0
    chunks_read: int = 0
    seconds: float = 0.0


class Staging:
    """Reused chunk-sized buffers on the communication device, for chunks that span several tensors."""

    def __init__(self, device: torch.device, nbytes: int) -> None:
        self.device = device
        self.nbytes = nbytes
        self.free: List[torch.Tensor] = []

    def get(self, n: int) -> torch.Tensor:
        if n > self.nbytes:  # not made by the schedule (shared chunks hold at most chunk_bytes): not pooled
            return torch.empty(n, dtype=torch.uint8, device=self.device)
        buffer = self.free.pop() if self.free else torch.empty(self.nbytes, dtype=torch.uint8, device=self.device)
        return buffer[:n]

    def put(self, view: torch.Tensor) -> None:
        base = view._base if view._base is not None else view
        if base.numel() == self.nbytes:
            self.free.append(base)


class Pending(NamedTuple):
    works: List[Any]
    buffer: torch.Tensor
    segments: List[Tuple[torch.Tensor, int, int, int]]  # (destination byte view, its offset, buffer offset, n)
    staged: bool


class Mover:
    """Step 4 on one rank: walks the schedule, reading its chunks and exchanging all the ones it needs."""

    def __init__(self, grp: Group, files: List[Any], views: List[List[Tuple[int, int, torch.Tensor]]],
                 device: torch.device, chunk_bytes: int, stats: LoadStats) -> None:
        self.grp = grp
        self.files = files
        self.views = views
        self.starts = [[b for b, _, _ in file_views] for file_views in views]
        self.staging = Staging(device, chunk_bytes)
        self.stats = stats
        self.failed: Optional[str] = None
        self.failed_cause: Optional[BaseException] = None
        self.pending: Deque[Pending] = collections.deque()

    def run(self, chunks: List[Chunk]) -> None:
        me = self.grp.rank
        for chunk in chunks:
            if me not in chunk.needers:
                continue
            self._start(chunk)
            while len(self.pending) > WINDOW:
                self._finish(self.pending.popleft())
        while self.pending:
            self._finish(self.pending.popleft())

    def _segments(self, chunk: Chunk) -> List[Tuple[torch.Tensor, int, int, int]]:
        file_views, starts = self.views[chunk.file], self.starts[chunk.file]
        i = max(0, bisect.bisect_right(starts, chunk.begin) - 1)
        out = []
        while i < len(file_views) and file_views[i][0] < chunk.end:
            begin, end, view = file_views[i]
            lo, hi = max(begin, chunk.begin), min(end, chunk.end)
            if hi > lo:
                out.append((view, lo - begin, lo - chunk.begin, hi - lo))
            i += 1
        # This rank needs the whole chunk (the schedule cut it so), and its pieces are disjoint.
        assert sum(n for *_, n in out) == chunk.end - chunk.begin, chunk
        return out

    def _start(self, chunk: Chunk) -> None:
        grp, me, n = self.grp, self.grp.rank, chunk.end - chunk.begin
        segments = self._segments(chunk)
        staged = len(segments) != 1
        if staged:
            buffer = self.staging.get(n)
        else:
            view, offset, _, _ = segments[0]
            buffer = view[offset : offset + n]
        works: List[Any] = []
        everyone = len(chunk.needers) == grp.world
        if chunk.owner == me:
            self._read(chunk, buffer)
            if everyone and grp.world > 1:
                works.append(dist.broadcast(buffer, src=grp.global_rank(me), group=grp.group, async_op=True))
            else:
                for r in chunk.needers:
                    if r != me:
                        works.append(dist.isend(buffer, dst=grp.global_rank(r), group=grp.group))
            self.stats.bytes_sent += n * (len(chunk.needers) - 1)
        else:
            src = grp.global_rank(chunk.owner)
            if everyone:
                works.append(dist.broadcast(buffer, src=src, group=grp.group, async_op=True))
            else:
                works.append(dist.irecv(buffer, src=src, group=grp.group))
            self.stats.bytes_received += n
        self.pending.append(Pending(works, buffer, segments, staged))

    def _read(self, chunk: Chunk, buffer: torch.Tensor) -> None:
        self.stats.chunks_read += 1
        if self.failed is not None:
            return  # the file failed already: take part with what the buffer holds, report at the end
        try:
            read_chunk(self.files[chunk.file], chunk.begin, buffer)
        except Exception as e:
            self.failed, self.failed_cause = error_text(e), e
            return
        self.stats.bytes_read += chunk.end - chunk.begin

    def _finish(self, pending: Pending) -> None:
        for work in pending.works:
            work.wait()
        if pending.staged:
            for view, offset, at, n in pending.segments:
                view[offset : offset + n].copy_(pending.buffer[at : at + n])
            self.staging.put(pending.buffer)


def read_chunk(file: Any, offset: int, dst: torch.Tensor) -> None:
    """Reads data-buffer bytes [offset, offset + dst.numel()) of ``file`` into the uint8 tensor ``dst`` (the
    seam the tests replace to make a rank fail or die mid-load)."""
    if dst.device.type == "cpu":
        file.read_range(offset, dst.data_ptr(), dst.numel())
        return
    # Accelerators: through the loading engine's pinned slabs, as every materialized device load.
    from .. import _engine

    _engine.fill(file, [(dst, offset, offset + dst.numel())], dst.device)

