"""A distributed load on one rank: the five steps of the package's docstring, in order (:func:`run`), for the
two kinds of destination: tensors the load allocates (:func:`load`: ``load_file``/``load_sharded``) and
tensors the caller holds (``_state_dict``: a state dict filled in place)."""

from __future__ import annotations

import os
import time
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

import torch
import torch.distributed as dist

from .._core import SafetensorError
from .._devices import resolve_torch_device
from .._plan import PlanValue, row_bytes
from .._torch_types import allocate
from ._group import Group, collective_failed, error_text, failures_text
from ._moving import Landing, LoadStats, Mover
from ._opening import Opened, Planned, digest
from ._opening import plan as plan_of
from ._schedule import merge_intervals, schedule

__all__ = ["Plan", "Prepared", "consistency_error", "load", "run"]

Plan = Optional[Mapping[str, PlanValue]]
#: What step 1 makes of what a rank opened: its pieces of each file and, beside each piece, where its bytes
#: land (None for a piece that holds no bytes or goes to the meta device).
Prepared = Tuple[List[List[Planned]], List[List[Optional[Landing]]]]


def load(open_source: Callable[[str], Opened], device: Any, group: Optional[dist.ProcessGroup], plan: Plan, backend: str,
         chunk_bytes: int, stats: Optional[LoadStats]) -> Dict[str, torch.Tensor]:
    """``load_file``/``load_sharded``: new tensors for ``plan``'s pieces, on ``device``."""
    out: Dict[str, torch.Tensor] = {}

    def prepare(opened: Opened, comm: torch.device) -> Prepared:
        pieces = plan_of(opened, plan)
        landings: List[List[Optional[Landing]]] = []
        for file_pieces in pieces:
            tensors, _ = allocate(file_pieces, comm)
            out.update((name, tensor) for (name, _), tensor in zip(file_pieces, tensors))
            landings.append([Landing(tensor, piece.code, comm) if piece.end > piece.begin else None
                             for (_, piece), tensor in zip(file_pieces, tensors)])
        return pieces, landings

    target = resolve_torch_device(device)
    comm = run(open_source, target, group, backend, chunk_bytes, stats, prepare)
    if comm != target:
        return {name: tensor.to(target) for name, tensor in out.items()}
    return out


def run(open_source: Callable[[str], Opened], target: torch.device, group: Optional[dist.ProcessGroup], backend: str,
        chunk_bytes: int, stats: Optional[LoadStats], prepare: Callable[[Opened, torch.device], Prepared],
        ) -> torch.device:
    """The five steps on this rank, for what ``open_source(backend)`` opens and ``prepare`` plans; returns the
    device the bytes travelled on."""
    started = time.perf_counter()
    grp = Group(group)
    stats = stats if stats is not None else LoadStats()

    # 1. Open, plan and allocate, locally; any error (out of memory included) becomes this rank's status.
    error: Optional[str] = None
    cause: Optional[BaseException] = None
    shards: List[Any] = []
    pieces: List[List[Planned]] = []
    landings: List[List[Optional[Landing]]] = []
    comm = target
    try:
        page = os.sysconf("SC_PAGE_SIZE")
        if isinstance(chunk_bytes, bool) or not isinstance(chunk_bytes, int) or chunk_bytes <= 0 or chunk_bytes % page:
            raise SafetensorError(f"chunk_bytes must be a positive multiple of the page size ({page}), got "
                                  f"{chunk_bytes!r}")
        comm = grp.comm_device(target)
        opened = open_source(backend)  # the native open refuses a backend that is not mmap or pread
        shards = opened.shards
        pieces, landings = prepare(opened, comm)
    except Exception as e:  # exchanged below: every rank raises it
        error, cause = error_text(e), e
        pieces, landings = [], []
    status = {
        "error": error,
        "chunk_bytes": chunk_bytes,
        "device": comm.type,
        "files": [(s.label, digest(s.file), s.file.data_offset) for s in shards],
        "needs": [merge_intervals([(p.begin, p.end) for _, p in file_pieces if p.box is None])
                  for file_pieces in pieces],
        "parts": [[(p.begin, name, p.box, row_bytes(p.code, p.shape)) for name, p in file_pieces
                   if p.box is not None and p.end > p.begin] for file_pieces in pieces],
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
                      bounds, [s["parts"] for s in statuses])
    stats.chunks = len(chunks)
    stats.bytes_scheduled = sum(c.end - c.begin for c in chunks)
    stats.bytes_needed = sum(p.nbytes for file_pieces in pieces for _, p in file_pieces)

    # 4. Move.
    if comm.type != "meta":
        views = [sorted(((p.begin, p.end, landing) for (_, p), landing in zip(fp, fl) if landing and p.box is None),
                        key=lambda v: v[0]) for fp, fl in zip(pieces, landings)]
        parts = {(f, name, p.box): landing for f, (fp, fl) in enumerate(zip(pieces, landings))
                 for (name, p), landing in zip(fp, fl) if landing is not None and p.box is not None}
        mover = Mover(grp, [s.file for s in shards], views, parts, comm, chunk_bytes, stats)
        try:
            mover.run(chunks)
        except RuntimeError as e:
            raise collective_failed(grp, "moving tensor bytes", e) from e
        if mover.failed is None:
            try:
                for file_landings in landings:
                    for landing in file_landings:
                        if landing is not None:
                            landing.finish()
            except Exception as e:
                mover.failed, mover.failed_cause = error_text(e), e
        # 5. Agree again.
        final = grp.gather(mover.failed, "reporting read errors")
        text = failures_text(final, grp.world, "reading")
        if text is not None:
            raise SafetensorError(text) from mover.failed_cause
    stats.seconds = time.perf_counter() - started
    return comm


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
