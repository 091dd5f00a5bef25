"""A distributed load on one rank: the five steps of the package's docstring, in order."""

from __future__ import annotations

import os
import time
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

import torch
import torch.distributed as dist

from .. import _safetensors_cpp as _cpp
from .._core import DTYPES, HOST_SWAPS, SafetensorError
from .._devices import resolve_torch_device
from .._torch_types import empty
from ._group import Group, collective_failed, error_text, failures_text
from ._moving import LoadStats, Mover
from ._opening import Opened, Planned, Shard, digest
from ._opening import plan as plan_of
from ._schedule import merge_intervals, schedule

__all__ = ["Plan", "consistency_error", "load", "to_native"]

Plan = Optional[Mapping[str, Optional[slice]]]


def load(open_source: Callable[[str], Opened], device: Any, group: Optional[dist.ProcessGroup], plan: Plan, backend: str,
         chunk_bytes: int, stats: Optional[LoadStats]) -> Dict[str, torch.Tensor]:
    """The five steps (the package's docstring) on this rank, for what ``open_source(backend)`` opens."""
    started = time.perf_counter()
    grp = Group(group)
    stats = stats if stats is not None else LoadStats()

    # 1. Open, plan and allocate, locally; any error (out of memory included) becomes this rank's status.
    error: Optional[str] = None
    cause: Optional[BaseException] = None
    shards: List[Shard] = []
    pieces: List[List[Planned]] = []
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
        opened = open_source(backend)  # the native open refuses a backend that is not mmap or pread
        shards = opened.shards
        pieces = plan_of(opened, plan)
        for file_pieces in pieces:
            file_views = []
            for name, (code, shape, begin, end) in file_pieces:
                tensor = empty(code, shape, comm)
                out[name] = tensor
                if end > begin and comm.type != "meta":
                    file_views.append((begin, end, tensor.reshape(-1).view(torch.uint8)))
            views.append(file_views)
    except Exception as e:  # exchanged below: every rank raises it
        error, cause = error_text(e), e
        out, views = {}, []
    status = {
        "error": error,
        "chunk_bytes": chunk_bytes,
        "device": None if comm is None else comm.type,
        "files": [(s.label, digest(s.file), s.file.data_offset) for s in shards],
        "needs": [merge_intervals([(b, e) for _, (_, _, b, e) in file_pieces]) for file_pieces in pieces],
    }

    # 2. Agree.
    statuses = grp.gather(status, "exchanging plans")
    text = failures_text([s["error"] for s in statuses], grp.world, "opening and planning")
    if text is None:
        text = consistency_error(statuses)
    if text is not None:
        raise SafetensorError(text) from cause

    # 3. Schedule.
    # Every rank has the same layouts (checked above), so tensor boundaries need no exchange.
    bounds = [[x for _, (_, _, b, e) in s.file.infos() for x in (b, e)] for s in shards]
    chunks = schedule([s["needs"] for s in statuses], [off for _, _, off in statuses[0]["files"]], chunk_bytes,
                      bounds)
    stats.chunks = len(chunks)
    stats.bytes_scheduled = sum(c.end - c.begin for c in chunks)
    stats.bytes_needed = sum(e - b for needs in status["needs"] for b, e in needs)

    # 4. Move.
    if comm.type != "meta":
        mover = Mover(grp, [s.file for s in shards], views, comm, chunk_bytes, stats)
        try:
            mover.run(chunks)
        except RuntimeError as e:
            raise collective_failed(grp, "moving tensor bytes", e) from e
        # 5. Agree again.
        final = grp.gather(mover.failed, "reporting read errors")
        text = failures_text(final, grp.world, "reading")
        if text is not None:
            raise SafetensorError(text) from mover.failed_cause
        to_native(out, pieces)
    if comm != target:
        out = {name: tensor.to(target) for name, tensor in out.items()}
    stats.seconds = time.perf_counter() - started
    return out


def consistency_error(statuses: List[Dict[str, Any]]) -> Optional[str]:
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
        for (label0, layout0, _), (label, layout, _) in zip(first["files"], s["files"]):
            if layout != layout0:
                return (f"distributed load: ranks opened different checkpoints: {label} on rank {r} differs from "
                        f"{label0} on rank 0 (tensor names, dtypes, shapes, offsets or metadata)")
    return None


def to_native(out: Dict[str, torch.Tensor], pieces: List[List[Planned]]) -> None:
    """Byte-swaps, in place, the tensors whose file bytes are not this host's values (multi-byte types on a
    big-endian host: HOST_SWAPS). The ranks move the file's little-endian bytes between them as they are,
    so the swap happens once, here, on every rank, after its bytes arrived."""
    for file_pieces in pieces:
        for name, (code, _shape, begin, end) in file_pieces:
            if code not in HOST_SWAPS or end <= begin:
                continue
            units = out[name].reshape(-1).view(torch.uint8)
            host = units if units.device.type == "cpu" else units.cpu()
            _cpp.byteswap(host, DTYPES[code].swap_bytes)  # the library's swap
            if host is not units:
                units.copy_(host)
