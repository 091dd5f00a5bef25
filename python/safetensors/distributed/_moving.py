"""Step 4 of a distributed load on one rank: walking the schedule, reading this rank's chunks with the native
positional reads and exchanging every chunk it needs over the process group, a window of them in flight.

Every piece's bytes land through a :class:`Landing`: straight into the rank's tensor where it has the file's
dtype, is contiguous and lives on the communication device (chunks inside it are read or received in place),
else copied in as they arrive, converted as ``Tensor.copy_`` converts (a bf16 file into f32 parameters, CPU
bytes into a CUDA or NPU tensor).

``read_chunk`` and ``read_part`` are the read seams (tests replace them to make a rank fail or die mid-load)."""

from __future__ import annotations

import bisect
import collections
import dataclasses
from typing import Any, Deque, Dict, List, NamedTuple, Optional, Tuple

import torch
import torch.distributed as dist

from .. import _safetensors_cpp as _cpp
from .._core import DTYPES, HOST_SWAPS, Box
from .._plan import read_box
from .._torch_types import as_bytes, torch_dtype
from ._group import Group, error_text, held, released
from ._schedule import Chunk

__all__ = ["Landing", "LoadStats", "Mover", "read_chunk", "read_part"]

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


class Landing:
    """Where one piece's bytes go on this rank. Bytes arrive in the file's order (little-endian values) and, for
    one piece, at increasing offsets (the schedule's order), so a value cut between two chunks is completed
    from the carried remainder."""

    def __init__(self, dest: torch.Tensor, code: str, comm: torch.device) -> None:
        self.dest = dest
        self.code = code
        self.dtype = torch_dtype(code)
        same = dest.dtype == self.dtype and dest.device == comm and dest.is_contiguous()
        #: A uint8 view of the destination the bytes land in as they are, else None (copied in by put).
        self.direct: Optional[torch.Tensor] = as_bytes(dest) if same else None
        self.target = dest if dest.is_contiguous() else torch.empty(dest.shape, dtype=dest.dtype, device=dest.device)
        self.carry: Optional[torch.Tensor] = None

    def put(self, offset: int, data: torch.Tensor) -> None:
        """Bytes [offset, offset + len(data)) of the piece (file order); ``data`` is uint8 on any device."""
        if self.direct is not None:
            self.direct[offset : offset + data.numel()].copy_(data)
            return
        size = self.dtype.itemsize
        if self.carry is not None:
            data = torch.cat([self.carry, data.to(self.carry.device)])
            offset -= self.carry.numel()
            self.carry = None
        whole = data.numel() // size * size
        if data.numel() > whole:
            self.carry = data[whole:].clone()
        if not whole:
            return
        units = data[:whole]
        if units.device.type != "cpu" or units.data_ptr() % size or self.code in HOST_SWAPS:
            units = units.cpu().clone() if units.device.type == "cpu" else units.cpu()
            if self.code in HOST_SWAPS:
                _cpp.byteswap(units, DTYPES[self.code].swap_bytes)
        first = offset // size
        self.target.view(-1)[first : first + whole // size].copy_(units.view(self.dtype))

    def finish(self) -> None:
        """Once every byte landed: a non-contiguous destination gets its values; direct bytes become values."""
        if self.target is not self.dest:
            self.dest.copy_(self.target)
        if self.direct is not None and self.code in HOST_SWAPS:
            host = self.direct if self.direct.device.type == "cpu" else self.direct.cpu()
            _cpp.byteswap(host, DTYPES[self.code].swap_bytes)
            if host is not self.direct:
                self.direct.copy_(host)


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
    segments: List[Tuple[Landing, int, int, int]]  # (landing, offset in the piece, buffer offset, n)
    in_place: bool  # the buffer is the destination itself


class Mover:
    """Step 4 on one rank: walks the schedule, reading its chunks and exchanging all the ones it needs.

    ``views[f]`` are this rank's byte pieces of file ``f`` as (begin, end, landing), sorted; ``parts`` its
    strided pieces, by (file, name, box)."""

    def __init__(self, grp: Group, files: List[Any], views: List[List[Tuple[int, int, Landing]]],
                 parts: Dict[Tuple[int, str, Box], Landing], device: torch.device, chunk_bytes: int,
                 stats: LoadStats) -> None:
        self.grp = grp
        self.files = files
        self.views = views
        self.parts = parts
        self.starts = [[b for b, _, _ in file_views] for file_views in views]
        self.staging = Staging(device, chunk_bytes)
        self.device = device
        self.stats = stats
        self.failed: Optional[str] = None
        self.failed_cause: Optional[BaseException] = None
        self.pending: Deque[Pending] = collections.deque()
        # CPU buffers handed to the backend, until run() has seen it let go of them (see _group.released).
        self.lent: List[torch.Tensor] = []

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
        released(self.lent)
        self.lent.clear()

    def _segments(self, chunk: Chunk) -> List[Tuple[Landing, int, int, int]]:
        if chunk.part is not None:
            name, box, _ = chunk.part
            return [(self.parts[(chunk.file, name, box)], chunk.begin, 0, chunk.end - chunk.begin)]
        file_views, starts = self.views[chunk.file], self.starts[chunk.file]
        i = max(0, bisect.bisect_right(starts, chunk.begin) - 1)
        out = []
        while i < len(file_views) and file_views[i][0] < chunk.end:
            begin, end, landing = file_views[i]
            lo, hi = max(begin, chunk.begin), min(end, chunk.end)
            if hi > lo:
                out.append((landing, lo - begin, lo - chunk.begin, hi - lo))
            i += 1
        # This rank needs the whole chunk (the schedule cut it so), and its pieces are disjoint.
        assert sum(n for *_, n in out) == chunk.end - chunk.begin, chunk
        return out

    def _start(self, chunk: Chunk) -> None:
        grp, me, n = self.grp, self.grp.rank, chunk.end - chunk.begin
        segments = self._segments(chunk)
        landing, offset, _, _ = segments[0]
        in_place = len(segments) == 1 and landing.direct is not None
        buffer = landing.direct[offset : offset + n] if in_place else self.staging.get(n)
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
        self.pending.append(Pending(works, buffer, segments, in_place))
        if works and buffer.device.type == "cpu":
            if len(self.lent) >= 4 * WINDOW:  # bounded: most were let go of long ago
                self.lent = [t for t in self.lent if held(t)]
            self.lent.append(buffer)

    def _read(self, chunk: Chunk, buffer: torch.Tensor) -> None:
        self.stats.chunks_read += 1
        if self.failed is not None:
            return  # the file failed already: take part with what the buffer holds, report at the end
        try:
            if chunk.part is None:
                read_chunk(self.files[chunk.file], chunk.begin, buffer)
            else:
                read_part(self.files[chunk.file], chunk.part[0], chunk.part[2], buffer)
        except Exception as e:
            self.failed, self.failed_cause = error_text(e), e
            return
        self.stats.bytes_read += chunk.end - chunk.begin

    def _finish(self, pending: Pending) -> None:
        for work in pending.works:
            work.wait()
        if not pending.in_place:
            if self.failed is None:
                try:
                    for landing, offset, at, n in pending.segments:
                        landing.put(offset, pending.buffer[at : at + n])
                except Exception as e:  # a conversion failed: reported at the end, as a read error is
                    self.failed, self.failed_cause = error_text(e), e
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


def read_part(file: Any, name: str, box: Box, dst: torch.Tensor) -> None:
    """Reads the ``box`` of tensor ``name`` (packed, in the file's byte order, as read_chunk's bytes are) into
    the uint8 tensor ``dst`` with the library's strided-run reader."""
    host = dst if dst.device.type == "cpu" else torch.empty(dst.numel(), dtype=torch.uint8)
    read_box(file, name, box, host.data_ptr())
    # read_box gives native values: back to the file's order, as every chunk travels (big-endian hosts only;
    # HOST_SWAPS is empty elsewhere, so the dtype is not looked up per chunk there).
    code = file.info(name)[0] if HOST_SWAPS else None
    if code in HOST_SWAPS:
        _cpp.byteswap(host, DTYPES[code].swap_bytes)
    if host is not dst:
        dst.copy_(host)

