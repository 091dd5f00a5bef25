"""Step 3 of a distributed load: the group's schedule, a pure function of what the ranks need (no process group,
no I/O), computed identically on every rank from what they exchanged."""

from __future__ import annotations

import bisect
from typing import List, NamedTuple, Optional, Sequence, Tuple

from .._core import Box
from .._plan import box_rows

__all__ = ["Chunk", "Interval", "Part", "merge_intervals", "schedule"]

Interval = Tuple[int, int]  # [begin, end) in data-buffer offsets
#: A piece read as strided runs: (where its span begins in the data buffer, tensor name, box, bytes of one index
#: of the box's first dimension). Ranks needing the same box share it; its chunks are ranges of that dimension.
Part = Tuple[int, str, Box, int]


class Chunk(NamedTuple):
    """One unit of the group's schedule: data-buffer bytes [begin, end) of file ``file``, read by ``owner``
    (a group rank), needed by ``needers`` (sorted group ranks, ``owner`` among them)."""

    file: int
    begin: int
    end: int
    owner: int
    needers: Tuple[int, ...]
    #: For a strided piece: (tensor name, the piece's box, the box of the rows this chunk holds); begin/end are
    #: then offsets in the piece's packed bytes (C-contiguous, as the rank's tensor holds it), not in the file.
    part: Optional[Tuple[str, Box, Box]] = None


def schedule(needs: Sequence[Sequence[Sequence[Interval]]], data_offsets: Sequence[int], chunk_bytes: int,
             boundaries: Optional[Sequence[Sequence[int]]] = None,
             parts: Optional[Sequence[Sequence[Sequence[Part]]]] = None) -> List[Chunk]:
    """The group's chunks, in the order every rank processes them.

    ``needs[r][f]`` are rank ``r``'s intervals of file ``f`` (sorted, disjoint, non-empty); ``data_offsets[f]``
    is where file ``f``'s data buffer starts; ``boundaries[f]`` (optional) are its tensors' begin/end offsets.
    Every byte some rank needs is in exactly one chunk, read by one of the ranks that need it, the one with the
    fewest bytes so far. Chunks are cut where the set of ranks needing the bytes changes; a tensor of at least
    a quarter of ``chunk_bytes`` gets chunks of its own (they land in it without staging), cut inside at
    multiples of ``chunk_bytes`` in file offsets (page-aligned; see ``_cut``); smaller tensors share chunks of
    up to ``chunk_bytes``.

    ``parts[r][f]`` (optional) are rank ``r``'s strided pieces of file ``f``: the ranks naming the same box
    share it, each range of about ``chunk_bytes`` of its first dimension one chunk (after the file's byte
    chunks), read by one of them. Boxes that overlap without being equal are read once per box.
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
                    for chunk_begin, chunk_end in _cut(base, s, e, chunk_bytes):
                        emit(f, chunk_begin, chunk_end, needers)
                    group_begin = group_end = e
                else:
                    if group_end - group_begin + (e - s) > chunk_bytes:
                        emit(f, group_begin, group_end, needers)
                        group_begin = s
                    group_end = e
            if group_end > group_begin:
                emit(f, group_begin, group_end, needers)
        sharing: dict = {}
        for rank, rank_parts in enumerate(parts or []):
            for part in (rank_parts[f] if f < len(rank_parts) else []):
                sharing.setdefault(tuple(part), []).append(rank)
        for (_, name, box, row_bytes), ranks in sorted(sharing.items()):
            rows = box[0][1] - box[0][0]
            step = max(1, chunk_bytes // max(1, row_bytes))
            for r0 in range(0, rows, step):
                r1 = min(rows, r0 + step)
                owner = min(ranks, key=lambda r: (assigned[r], r))
                assigned[owner] += (r1 - r0) * row_bytes
                out.append(Chunk(f, r0 * row_bytes, r1 * row_bytes, owner, tuple(sorted(ranks)),
                                 (name, box, box_rows(box, r0, r1))))
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
    covering a byte changes (adjacent regions with the same set joined)."""
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


def merge_intervals(intervals: List[Interval]) -> List[Interval]:
    """``intervals`` sorted, empty ones dropped, overlapping and touching ones joined."""
    out: List[Interval] = []
    for begin, end in sorted(intervals):
        if end <= begin:
            continue
        if out and begin <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((begin, end))
    return out

