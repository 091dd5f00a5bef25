"""Loading a checkpoint on every rank of a ``torch.distributed`` process group, each byte read once per group.

When every rank of a job opens the same checkpoint and reads all of it, storage serves it ``world`` times (8
ranks on NFS read it 8 times). Here the ranks split the reading and hand each other the bytes over the
process group's own collectives -- NCCL on CUDA, HCCL on Ascend NPU, gloo on the CPU; no transport of our own.

A load runs in five steps, the same on every rank:

1. Open and plan, locally. Each rank opens the files and turns its own plan (``None``: every tensor whole;
   else ``{name: None | slice of rows}``, validated exactly as ``safe_open.prefetch`` validates its plans)
   into byte intervals of each file's data buffer.
2. Agree, before any data moves (one ``all_gather_object``): every rank's status (ok, or its error text), the
   layout of every file it opened, its device type and its intervals. An error on any rank, ranks whose
   files differ in layout, or ranks loading to different device types raise the same SafetensorError on
   every rank.
3. Schedule, identically on every rank from what was gathered (:func:`schedule`): the union of all intervals
   is cut where the set of ranks needing the bytes changes, and at chunk boundaries (multiples of
   ``chunk_bytes`` in file offsets, so page-aligned); each chunk gets one reader among the ranks that need it,
   the one with the fewest bytes assigned so far. Bytes no rank needs are in no chunk: nobody reads them.
4. Move, in schedule order. A chunk's reader reads it with the native positional reads (GIL released) and
   broadcasts it when every rank needs it, or sends it to the ranks that need it; those receive it. The
   collectives are asynchronous, at most a window of chunks in flight, so a rank reads its next chunk while
   the previous ones travel. A chunk inside one tensor lands in that tensor; other chunks land in a staging
   buffer and are copied out. Accelerators communicate on the destination device; a gloo group moves CPU
   tensors.
5. Agree again: a read that failed does not leave its rank's collectives (it sends what it has, so nobody
   waits forever); the error is exchanged at the end and raised on every rank with the same text.

A rank that dies makes the others' collectives fail (at once when its connections close, else after the
process group's timeout); that is raised as a SafetensorError and the process group is unusable afterwards.
"""

from __future__ import annotations

import bisect
import collections
import dataclasses
import hashlib
import os
import time
from typing import Any, Deque, Dict, List, Mapping, NamedTuple, Optional, Sequence, Tuple, Union

import torch
import torch.distributed as dist

from . import _safetensors_cpp as _cpp
from ._core import DTYPES, PathLike, SafetensorError, _fspath
from ._devices import resolve_torch_device
from ._strategies import HOST_SWAPS
from .torch import _torch_dtype, _torch_shape

__all__ = ["DEFAULT_CHUNK_BYTES", "LoadStats", "load_file", "load_sharded", "schedule"]

#: Bytes per chunk: the unit of reading and of one collective. A multiple of the page size. Chunks stay under
#: 1.5x this, so each is one positional read of the native reader (which splits reads at 8 MiB): the kernel
#: takes a lone read for a random one and reads just it, where two pieces look sequential and its readahead
#: (up to read_ahead_kb) runs into the next rank's chunk -- storage reads grew from 1/world to nearly the
#: whole file per rank with 16 MiB chunks on a disk with read_ahead_kb=8192.
DEFAULT_CHUNK_BYTES = 4 << 20
#: Chunks in flight per rank (each may hold one staging buffer of chunk_bytes).
_WINDOW = 8

Plan = Optional[Mapping[str, Optional[slice]]]
Interval = Tuple[int, int]  # [begin, end) in data-buffer offsets


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


class Chunk(NamedTuple):
    """One unit of the group's schedule: data-buffer bytes [begin, end) of file ``file``, read by ``owner``
    (a group rank), needed by ``needers`` (sorted group ranks, ``owner`` among them)."""

    file: int
    begin: int
    end: int
    owner: int
    needers: Tuple[int, ...]


# -- the public entry points -----------------------------------------------------------------------------------

def load_file(
    filename: PathLike,
    device: Union[str, int, torch.device] = "cpu",
    *,
    group: Optional[dist.ProcessGroup] = None,
    plan: Plan = None,
    backend: str = "auto",
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    stats: Optional[LoadStats] = None,
) -> Dict[str, torch.Tensor]:
    """Loads ``filename`` on every rank of ``group``, reading each byte from storage once per group.

    Every rank of the group must call this (a collective). Ranks may pass different paths to the same
    checkpoint (e.g. a local copy per host) and different plans.

    Args:
        filename: the ``.safetensors`` file.
        device: where this rank's tensors go (``"cpu"``, ``"cuda:1"``, ``"npu:0"``, an int, a ``torch.device``,
            ``"meta"``); every rank must name the same device type.
        group: the process group (None: the default group). Its backend moves the bytes: NCCL/HCCL/... on
            the destination device, gloo (or MPI) through CPU tensors.
        plan: ``None``: every tensor, whole (each rank gets exactly what ``safetensors.torch.load_file``
            gives). Else this rank's ``{name: None | slice}``: ``None`` for a whole tensor, a step-1 slice for
            rows ``[start, stop)`` of its first dimension (negative bounds count from the end; never clamped),
            as for ``safe_open.prefetch``; ``{}`` takes part in the load and gets nothing. Ranks needing the
            same bytes share one read; bytes no rank needs are not read.
        backend: how files are read (``"auto"``: past the page cache where a file is not cached, else through
            it; ``"direct"``, ``"pread"`` or ``"mmap"``: as for ``safe_open``); tensors always own their memory.
        chunk_bytes: bytes per chunk (a multiple of the page size): the unit of one read and one collective.
        stats: a :class:`LoadStats` to fill with what this rank read and moved.

    Returns:
        ``{name: tensor}`` in file order: this rank's tensors (slices for sliced plan entries) on ``device``.

    Raises:
        SafetensorError: on every rank, with the same text, when any rank's file or plan is wrong (missing
            file or tensor, bad slice, ...), when ranks opened files of different layouts, or when a read
            failed on some rank; on the surviving ranks when a rank died or a collective timed out (bounded
            by the process group's timeout; the group is unusable afterwards).
    """
    return _load(_SingleFile(filename), device, group, plan, backend, chunk_bytes, stats)


def load_sharded(
    checkpoint: Union[PathLike, Sequence[PathLike]],
    device: Union[str, int, torch.device] = "cpu",
    *,
    group: Optional[dist.ProcessGroup] = None,
    plan: Plan = None,
    backend: str = "auto",
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    stats: Optional[LoadStats] = None,
) -> Dict[str, torch.Tensor]:
    """:func:`load_file` for a checkpoint of several files, planned and scheduled as one.

    ``checkpoint`` is an index file (``model.safetensors.index.json``: the shards it names, each limited to
    the tensors its ``weight_map`` assigns to it), a directory (its one index file, else every
    ``*.safetensors`` file in it), a single ``.safetensors`` file, or a sequence of ``.safetensors`` files.
    ``plan`` names tensors of the whole checkpoint. Returns ``{name: tensor}`` in shard order, then file order
    within a shard. Arguments and errors are those of :func:`load_file`; a name in no shard is refused with
    ``checkpoint ... does not contain tensor NAME``, a name in two shards (no index) with ``... is in both``.
    """
    return _load(_Checkpoint(checkpoint), device, group, plan, backend, chunk_bytes, stats)


# -- the schedule: a pure function of what the ranks need ------------------------------------------------------

def schedule(needs: Sequence[Sequence[Sequence[Interval]]], data_offsets: Sequence[int], chunk_bytes: int,
             boundaries: Optional[Sequence[Sequence[int]]] = None) -> List[Chunk]:
    """The group's chunks, in the order every rank processes them.

    ``needs[r][f]`` are rank ``r``'s intervals of file ``f`` (sorted, disjoint, non-empty); ``data_offsets[f]``
    is where file ``f``'s data buffer starts; ``boundaries[f]`` (optional) are its tensors' begin/end offsets.
    Every byte some rank needs is in exactly one chunk, read by one of the ranks that need it, the one with the
    fewest bytes so far. Chunks are cut where the set of ranks needing the bytes changes; a tensor of at least
    a quarter of ``chunk_bytes`` gets chunks of its own (they land in it without staging), cut inside at
    multiples of ``chunk_bytes`` in file offsets (page-aligned; see ``_cut``); smaller tensors share chunks of
    up to ``chunk_bytes``.
    """
    world = len(needs)
    assigned = [0] * world
    out: List[Chunk] = []

    def emit(f: int, begin: int, end: int, needers: Tuple[int, ...]) -> None:
        owner = min(needers, key=lambda r: (assigned[r], r))
        assigned[owner] += end - begin
        out.append(Chunk(f, begin, end, owner, needers))

    for f, base in enumerate(data_offsets):
        cuts = sorted(set(boundaries[f])) if boundaries is not None else []
        for begin, end, needers in _regions([rank_needs[f] if f < len(rank_needs) else [] for rank_needs in needs]):
            lo, hi = bisect.bisect_right(cuts, begin), bisect.bisect_left(cuts, end)
            edges = [begin] + cuts[lo:hi] + [end]
            group_begin = group_end = begin  # small tensors gathered into one chunk
            for s, e in zip(edges, edges[1:]):
                if e - s >= chunk_bytes // 4:
                    if group_end > group_begin:
                        emit(f, group_begin, group_end, needers)
                    for piece_begin, piece_end in _cut(base, s, e, chunk_bytes):
                        emit(f, piece_begin, piece_end, needers)
                    group_begin = group_end = e
                else:
                    if group_end - group_begin + (e - s) > chunk_bytes:
                        emit(f, group_begin, group_end, needers)
                        group_begin = s
                    group_end = e
            if group_end > group_begin:
                emit(f, group_begin, group_end, needers)
    return out


def _cut(base: int, begin: int, end: int, chunk_bytes: int) -> List[Interval]:
    """[begin, end) of one tensor cut at multiples of ``chunk_bytes`` in file offsets (``base`` + offset), a
    head or tail shorter than a quarter chunk joined to its neighbour: chunks stay under 1.5 x chunk_bytes,
    and no rank gets two adjacent chunks for a sliver (which the kernel would take for a sequential read and
    read ahead into the next rank's bytes)."""
    small = chunk_bytes // 4
    out: List[Interval] = []
    pos = begin
    while pos < end:
        stop = min(end, ((base + pos) // chunk_bytes + 1) * chunk_bytes - base)
        if stop - pos < small and stop < end:
            stop = min(end, stop + chunk_bytes)
        if end - stop < small:
            stop = end
        out.append((pos, stop))
        pos = stop
    return out


def _regions(per_rank: List[Sequence[Interval]]) -> List[Tuple[int, int, Tuple[int, ...]]]:
    """[(begin, end, needers)]: the union of the ranks' intervals of one file, cut where the set of ranks
    covering a byte changes (adjacent pieces with the same set joined)."""
    events: List[Tuple[int, int, int]] = []  # (position, +1 start / -1 end, rank)
    for rank, intervals in enumerate(per_rank):
        for begin, end in intervals:
            events.append((begin, 1, rank))
            events.append((end, -1, rank))
    events.sort()
    out: List[Tuple[int, int, Tuple[int, ...]]] = []
    active: set = set()
    i = 0
    while i < len(events):
        pos = events[i][0]
        while i < len(events) and events[i][0] == pos:
            _, kind, rank = events[i]
            if kind > 0:
                active.add(rank)
            else:
                active.discard(rank)
            i += 1
        if i == len(events) or not active:
            continue
        needers = tuple(sorted(active))
        nxt = events[i][0]
        if out and out[-1][1] == pos and out[-1][2] == needers:
            out[-1] = (out[-1][0], nxt, needers)
        else:
            out.append((pos, nxt, needers))
    return out


def _merge(intervals: List[Interval]) -> List[Interval]:
    out: List[Interval] = []
    for begin, end in sorted(intervals):
        if end <= begin:
            continue
        if out and begin <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((begin, end))
    return out


# -- what a rank opens: one file, or the shards of a checkpoint -----------------------------------------------

Piece = Tuple[str, Tuple[str, Tuple[int, ...], int, int]]  # (name, (code, shape, begin, end))


class _Opened(NamedTuple):
    label: str  # the file's name, for messages (paths may differ between ranks)
    file: Any  # _cpp.File
    names: List[str]  # the tensors of the checkpoint this file holds, in file order


class _SingleFile:
    def __init__(self, filename: PathLike) -> None:
        self.filename = filename

    def open(self, backend: str) -> List[_Opened]:
        file = _cpp.File(_fspath(self.filename), backend)
        return [_Opened(os.path.basename(file.path), file, file.offset_keys())]

    def missing(self, name: str, opened: List[_Opened]) -> SafetensorError:
        try:
            opened[0].file.info(name)
        except SafetensorError as e:  # the reference's "File does not contain tensor NAME"
            return e
        raise AssertionError(name)


class _Checkpoint:
    def __init__(self, checkpoint: Union[PathLike, Sequence[PathLike]]) -> None:
        self.checkpoint = checkpoint
        self.shown = checkpoint if isinstance(checkpoint, (str, bytes, os.PathLike)) else "(files)"

    def open(self, backend: str) -> List[_Opened]:
        from ._sharding import CheckpointError, Shard, resolve

        index = None
        if isinstance(self.checkpoint, (str, bytes, os.PathLike)):
            path = _fspath(self.checkpoint)
            try:
                checkpoint = resolve(path)
            except CheckpointError as e:
                raise SafetensorError(str(e)) from None
            shards, index = checkpoint.shards, checkpoint.index
            self.shown = path
        else:
            shards = [Shard(_fspath(p)) for p in self.checkpoint]
            if not shards:
                raise SafetensorError("load_sharded: no files given")
        opened: List[_Opened] = []
        owner: Dict[str, str] = {}
        for shard in shards:
            file = _cpp.File(shard.path, backend)
            label = os.path.basename(shard.path)
            # With an index, the tensors it assigns to this shard (file order), or the library's error naming
            # the shard and the first assigned tensor it lacks; without one, every tensor of the file.
            names = file.offset_keys() if index is None else index.select(file, shard.position)
            for name in names:
                if name in owner:
                    raise SafetensorError(f"tensor {name} is in both {owner[name]} and {label}")
                owner[name] = label
            opened.append(_Opened(label, file, names))
        return opened

    def missing(self, name: str, opened: List[_Opened]) -> SafetensorError:
        return SafetensorError(f"checkpoint {self.shown} does not contain tensor {name}")


def _plan_file(opened: _Opened, plan: Optional[Dict[str, Optional[slice]]]) -> List[Piece]:
    """This rank's pieces of one file, in file order (``plan`` None: every tensor of ``opened.names``).

    Rows are validated by prefetch's validator (``_prefetch._rows``: its texts); ``plan_pieces`` itself is not
    used because it refuses F64 tensors (its F6 check is ``code.startswith("F6")``)."""
    from ._core import DTYPES
    from ._prefetch import _rows

    chosen: Dict[str, Optional[slice]] = dict.fromkeys(opened.names) if plan is None else plan
    pieces = []
    for name, (code, shape, begin, end) in opened.file.infos():
        if name not in chosen:
            continue
        rows = chosen[name]
        if rows is not None:
            if not isinstance(rows, slice):
                raise SafetensorError(f"distributed load plan values must be None or a slice, got "
                                      f"{type(rows).__name__} (tensor {name})")
            begin, end, shape = _rows(opened.file, name, code, shape, begin, end, rows, DTYPES[code].bits)
        _torch_dtype(code)  # a dtype torch lacks (F6), or F4 rows it cannot pack, fail as load_file fails
        _torch_shape(code, shape)
        pieces.append((name, (code, shape, begin, end)))
    return pieces


def _digest(file: Any) -> str:
    """The layout of a file (names, dtypes, shapes, offsets, metadata, size): ranks must agree on it. The
    tensor bytes themselves cannot be compared without reading them."""
    text = repr((file.size, file.data_offset, file.infos(), sorted((file.metadata() or {}).items())))
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:32]


def _error_text(e: BaseException) -> str:
    return str(e) if isinstance(e, SafetensorError) else f"{type(e).__name__}: {e}"


# -- the process group ----------------------------------------------------------------------------------------

# Backends that move CPU tensors; every other backend is taken to serve its accelerator's device type.
_CPU_BACKENDS = ("gloo", "mpi", "ucc")


class _Group:
    def __init__(self, group: Optional[dist.ProcessGroup]) -> None:
        if not dist.is_available() or not dist.is_initialized():
            raise SafetensorError(
                "safetensors.distributed needs an initialized process group: call "
                "torch.distributed.init_process_group(...) on every rank first"
            )
        self.group = group if group is not None else dist.group.WORLD
        self.rank = dist.get_rank(self.group)
        if self.rank < 0:
            raise SafetensorError("safetensors.distributed: this process is not a member of the given process group")
        self.world = dist.get_world_size(self.group)
        self.backend = str(dist.get_backend(self.group)).lower()
        self._global = [dist.get_global_rank(self.group, r) if self.group is not dist.group.WORLD else r
                        for r in range(self.world)]

    def global_rank(self, rank: int) -> int:
        return self._global[rank]

    def backend_for(self, device_type: str) -> Optional[str]:
        """The backend that moves tensors of ``device_type`` ("cpu:gloo,cuda:nccl" names one per type)."""
        if ":" in self.backend:
            pairs = dict(item.split(":", 1) for item in self.backend.split(",") if ":" in item)
            return pairs.get(device_type)
        if self.backend in _CPU_BACKENDS:
            return self.backend if device_type == "cpu" else None
        return self.backend if device_type != "cpu" else None

    def comm_device(self, target: torch.device) -> torch.device:
        """Where the bytes travel: the destination device when the group has a backend for it that is not a
        CPU backend (NCCL, HCCL, ...), else CPU tensors (gloo), copied to the destination at the end."""
        if target.type == "meta":
            return target
        backend = self.backend_for(target.type)
        if target.type != "cpu" and backend is not None and backend not in _CPU_BACKENDS:
            return target
        if self.backend_for("cpu") is None:
            raise SafetensorError(
                f"process group backend {self.backend} cannot move tensors for device {target}: load to a device "
                "it serves, or use a group with a CPU backend (gloo)"
            )
        return torch.device("cpu")

    def gather(self, obj: Any, what: str) -> List[Any]:
        out: List[Any] = [None] * self.world
        try:
            dist.all_gather_object(out, obj, group=self.group)
        except RuntimeError as e:
            raise _collective_failed(self, what, e) from e
        return out


def _collective_failed(grp: _Group, what: str, e: BaseException) -> SafetensorError:
    return SafetensorError(
        f"distributed load: a collective failed on rank {grp.rank} of {grp.world} while {what} (another rank "
        f"died, failed outside the load, or timed out; the process group cannot be used any more): "
        f"{str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__}"
    )


def _failures_text(statuses: List[Optional[str]], world: int, what: str) -> Optional[str]:
    failed = [(r, text) for r, text in enumerate(statuses) if text is not None]
    if not failed:
        return None
    if len(failed) == 1:
        r, text = failed[0]
        return f"distributed load failed on rank {r} of {world} ({what}): {text}"
    listed = "; ".join(f"rank {r}: {text}" for r, text in failed)
    return f"distributed load failed on {len(failed)} of {world} ranks ({what}): {listed}"


# -- the load -------------------------------------------------------------------------------------------------

def _load(source: Any, device: Any, group: Optional[dist.ProcessGroup], plan: Plan, backend: str,
          chunk_bytes: int, stats: Optional[LoadStats]) -> Dict[str, torch.Tensor]:
    started = time.perf_counter()
    grp = _Group(group)
    stats = stats if stats is not None else LoadStats()

    # 1. Open, plan and allocate, locally; any error (out of memory included) becomes this rank's status.
    error: Optional[str] = None
    cause: Optional[BaseException] = None
    opened: List[_Opened] = []
    pieces: List[List[Piece]] = []
    out: Dict[str, torch.Tensor] = {}
    views: List[List[Tuple[int, int, torch.Tensor]]] = []  # per file: (begin, end, byte view), sorted
    target = comm = None
    try:
        page = os.sysconf("SC_PAGE_SIZE")
        if isinstance(chunk_bytes, bool) or not isinstance(chunk_bytes, int) or chunk_bytes <= 0 or chunk_bytes % page:
            raise SafetensorError(f"chunk_bytes must be a positive multiple of the page size ({page}), got "
                                  f"{chunk_bytes!r}")
        target = resolve_torch_device(device)
        comm = grp.comm_device(target)
        if backend not in ("mmap", "pread", "direct", "auto"):
            raise SafetensorError(
                f'backend "{backend}" is invalid (expected one of: "mmap", "pread", "direct", "auto")')
        opened = source.open(backend)
        pieces = _plan(source, opened, plan)
        for file_pieces in pieces:
            file_views = []
            for name, (code, shape, begin, end) in file_pieces:
                tensor = torch.empty(_torch_shape(code, shape), dtype=_torch_dtype(code), device=comm)
                out[name] = tensor
                if end > begin and comm.type != "meta":
                    file_views.append((begin, end, tensor.reshape(-1).view(torch.uint8)))
            views.append(file_views)
    except Exception as e:  # exchanged below: every rank raises it
        error, cause = _error_text(e), e
        out, views = {}, []
    status = {
        "error": error,
        "chunk_bytes": chunk_bytes,
        "device": None if comm is None else comm.type,
        "files": [(o.label, _digest(o.file), o.file.data_offset) for o in opened],
        "needs": [_merge([(b, e) for _, (_, _, b, e) in file_pieces]) for file_pieces in pieces],
    }

    # 2. Agree.
    statuses = grp.gather(status, "exchanging plans")
    text = _failures_text([s["error"] for s in statuses], grp.world, "opening and planning")
    if text is None:
        text = _consistency_error(statuses)
    if text is not None:
        raise SafetensorError(text) from cause

    # 3. Schedule.
    # Every rank has the same layouts (checked above), so tensor boundaries need no exchange.
    bounds = [[x for _, (_, _, b, e) in o.file.infos() for x in (b, e)] for o in opened]
    chunks = schedule([s["needs"] for s in statuses], [off for _, _, off in statuses[0]["files"]], chunk_bytes,
                      bounds)
    stats.chunks = len(chunks)
    stats.bytes_scheduled = sum(c.end - c.begin for c in chunks)
    stats.bytes_needed = sum(e - b for needs in status["needs"] for b, e in needs)

    # 4. Move.
    if comm.type != "meta":
        mover = _Mover(grp, [o.file for o in opened], views, comm, chunk_bytes, stats)
        try:
            mover.run(chunks)
        except RuntimeError as e:
            raise _collective_failed(grp, "moving tensor bytes", e) from e
        # 5. Agree again.
        final = grp.gather(mover.failed, "reporting read errors")
        text = _failures_text(final, grp.world, "reading")
        if text is not None:
            raise SafetensorError(text) from mover.failed_cause
        _to_native(out, pieces)
    if comm != target:
        out = {name: tensor.to(target) for name, tensor in out.items()}
    stats.seconds = time.perf_counter() - started
    return out


def _plan(source: Any, opened: List[_Opened], plan: Plan) -> List[List[Piece]]:
    if plan is None:
        return [_plan_file(o, None) for o in opened]
    if not isinstance(plan, Mapping):
        raise SafetensorError(f"distributed load plan must be a dict of tensor names to None or a slice, got "
                              f"{type(plan).__name__}")
    where = {name: i for i, o in enumerate(opened) for name in o.names}
    per_file: List[Dict[str, Optional[slice]]] = [{} for _ in opened]
    for name, rows in plan.items():
        if not isinstance(name, str):
            raise SafetensorError("distributed load plan keys must be tensor names")
        if name not in where:
            raise source.missing(name, opened)
        per_file[where[name]][name] = rows
    return [_plan_file(o, sub) for o, sub in zip(opened, per_file)]


def _consistency_error(statuses: List[Dict[str, Any]]) -> Optional[str]:
    first = statuses[0]
    for r, s in enumerate(statuses[1:], 1):
        if s["chunk_bytes"] != first["chunk_bytes"]:
            return (f"distributed load: ranks chose different chunk sizes ({first['chunk_bytes']} on rank 0, "
                    f"{s['chunk_bytes']} on rank {r}): chunk_bytes must be the same on every rank")
        if s["device"] != first["device"]:
            return (f"distributed load: ranks move bytes on different device types ({first['device']} on rank 0, "
                    f"{s['device']} on rank {r}): every rank must load to the same kind of device")
        if len(s["files"]) != len(first["files"]):
            return (f"distributed load: ranks opened different checkpoints ({len(first['files'])} files on rank 0, "
                    f"{len(s['files'])} on rank {r})")
        for (label0, digest0, _), (label, digest, _) in zip(first["files"], s["files"]):
            if digest != digest0:
                return (f"distributed load: ranks opened different checkpoints: {label} on rank {r} differs from "
                        f"{label0} on rank 0 (tensor names, dtypes, shapes, offsets or metadata)")
    return None


class _Staging:
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


class _Pending(NamedTuple):
    works: List[Any]
    buffer: torch.Tensor
    segments: List[Tuple[torch.Tensor, int, int, int]]  # (destination byte view, its offset, buffer offset, n)
    staged: bool


class _Mover:
    """Step 4 on one rank: walks the schedule, reading its chunks and exchanging all the ones it needs."""

    def __init__(self, grp: _Group, files: List[Any], views: List[List[Tuple[int, int, torch.Tensor]]],
                 device: torch.device, chunk_bytes: int, stats: LoadStats) -> None:
        self.grp = grp
        self.files = files
        self.views = views
        self.starts = [[b for b, _, _ in file_views] for file_views in views]
        self.staging = _Staging(device, chunk_bytes)
        self.stats = stats
        self.failed: Optional[str] = None
        self.failed_cause: Optional[BaseException] = None
        self.pending: Deque[_Pending] = collections.deque()

    def run(self, chunks: List[Chunk]) -> None:
        me = self.grp.rank
        for chunk in chunks:
            if me not in chunk.needers:
                continue
            self._start(chunk)
            while len(self.pending) > _WINDOW:
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
        self.pending.append(_Pending(works, buffer, segments, staged))

    def _read(self, chunk: Chunk, buffer: torch.Tensor) -> None:
        self.stats.chunks_read += 1
        if self.failed is not None:
            return  # the file failed already: take part with what the buffer holds, report at the end
        try:
            _read_chunk(self.files[chunk.file], chunk.begin, buffer)
        except Exception as e:
            self.failed, self.failed_cause = _error_text(e), e
            return
        self.stats.bytes_read += chunk.end - chunk.begin

    def _finish(self, pending: _Pending) -> None:
        for work in pending.works:
            work.wait()
        if pending.staged:
            for view, offset, at, n in pending.segments:
                view[offset : offset + n].copy_(pending.buffer[at : at + n])
            self.staging.put(pending.buffer)


def _to_native(out: Dict[str, torch.Tensor], pieces: List[List[Piece]]) -> None:
    """Byte-swaps, in place, the tensors whose file bytes are not this host's values (multi-byte types on a
    big-endian host: HOST_SWAPS). The ranks move the file's little-endian bytes between them as they are,
    so the swap happens once, here, on every rank, after its bytes arrived."""
    for file_pieces in pieces:
        for name, (code, _shape, begin, end) in file_pieces:
            if code not in HOST_SWAPS or end <= begin:
                continue
            units = out[name].reshape(-1).view(torch.uint8).view(-1, DTYPES[code].swap_bytes)
            units.copy_(units.flip(1))


def _read_chunk(file: Any, offset: int, dst: torch.Tensor) -> None:
    """Reads data-buffer bytes [offset, offset + dst.numel()) of ``file`` into the uint8 tensor ``dst`` (the
    seam the tests replace to make a rank fail or die mid-load)."""
    if dst.device.type == "cpu":
        file.read_range(offset, dst.data_ptr(), dst.numel())
        return
    # Accelerators: through the loading engine's pinned slabs, as every materialized device load.
    from . import _engine

    _engine.fill(file, [(dst, offset, offset + dst.numel())], dst.device)
