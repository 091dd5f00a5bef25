"""What a load plan selects: ``{name: None | slice | tuple of slices}`` validated into pieces of a file.

One set of rules and error texts for every plan (``safe_open.prefetch``, the distributed loader's ``plan=``,
``safetensors.distributed.load_state_dict``), applied before anything is read or allocated:

- ``None``: the whole tensor;
- a ``slice``: rows ``[start, stop)`` of the first dimension;
- a tuple of slices, one per leading dimension (``(slice(None), slice(128, 256))``); dimensions it does not
  name are taken whole.

Slices have step 1 (or None), integer bounds, negative bounds counting from the end, and are never clamped: a
plan is explicit, so a bound out of range is an error naming the tensor.

A piece whose bytes are one contiguous run of the file (rows, a whole tensor, or a box that only narrows its
leading dimensions to one index before the first narrowed one) is a byte range ``[begin, end)``; any other box
(a shard of an inner dimension) is read as strided runs by the library's slice reader (``File.read_slice``,
which reads runs close together as one read and the rest as separate reads), and carries its ``box``. Pieces
are ``_core.Piece``.
"""

from __future__ import annotations

import operator
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from ._core import DTYPES, Box, Piece
from ._safetensors_cpp import SafetensorError

__all__ = ["PlanValue", "box_rows", "checked_plan", "plan_pieces", "read_box", "row_bytes"]

#: What a plan says of one tensor.
PlanValue = Union[None, slice, Tuple[slice, ...]]


def checked_plan(plan: Any) -> Dict[str, PlanValue]:
    """``plan`` as a dict, its keys and value types checked (bounds are checked per tensor by plan_pieces)."""
    if not isinstance(plan, Mapping):
        raise SafetensorError(f"prefetch plan must be a dict of tensor names to None, a slice or a tuple of "
                              f"slices, got {type(plan).__name__}")
    chosen: Dict[str, PlanValue] = {}
    for name, value in plan.items():
        if not isinstance(name, str):
            raise SafetensorError("prefetch plan keys must be tensor names")
        if isinstance(value, list):
            value = tuple(value)
        if value is not None and not isinstance(value, slice) and not (
                isinstance(value, tuple) and all(isinstance(s, slice) for s in value)):
            raise SafetensorError(f"prefetch plan values must be None, a slice or a tuple of slices, got "
                                  f"{type(value).__name__} (tensor {name})")
        chosen[name] = value
    return chosen


def plan_pieces(file: Any, plan: Optional[Mapping[str, PlanValue]], *, names: Optional[Sequence[str]] = None,
                empty_ok: bool = False) -> List[Tuple[str, Piece]]:
    """The pieces ``plan`` names in ``file`` (a ``_safetensors_cpp.File``), in file order, as torch can hold
    them; every error of the plan is raised here, before any I/O.

    ``plan``: None takes every tensor of ``names`` (default: every tensor of the file) whole; else
    ``{name: None | slice | tuple of slices}`` (the module's rules). A plan that selects nothing is refused
    unless ``empty_ok``."""
    from ._torch_types import torch_dtype, torch_shape

    if plan is None:
        chosen: Dict[str, PlanValue] = dict.fromkeys(file.offset_keys() if names is None else names)
    else:
        chosen = checked_plan(plan)
        for name in chosen:
            if name not in file:
                file.info(name)  # the reference's "File does not contain tensor NAME"
        if not chosen and not empty_ok:
            raise SafetensorError("prefetch plan selects no tensors")
    pieces = []
    for name, (code, shape, begin, end) in file.infos():
        if name not in chosen:
            continue
        torch_dtype(code)  # a dtype torch lacks (F6) fails here
        piece = Piece(code, tuple(shape), begin, end)
        value = chosen[name]
        if value is not None:
            piece = _select(file, name, piece, value if isinstance(value, tuple) else (value,))
        torch_shape(code, piece.shape)  # so do packed F4 rows torch cannot hold
        pieces.append((name, piece))
    return pieces


def _select(file: Any, name: str, whole: Piece, slices: Tuple[slice, ...]) -> Piece:
    shape = whole.shape
    if len(slices) > len(shape):
        if not shape:
            raise SafetensorError(f"cannot slice rows of the 0-d tensor {name}")
        raise SafetensorError(f"prefetch plan for {name} has {len(slices)} slices but the tensor has "
                              f"{len(shape)} dimensions")
    box = tuple(_bounds(name, s, n) for s, n in zip(slices, shape)) + tuple((0, n) for n in shape[len(slices):])
    sub = tuple(stop - start for start, stop in box)
    # The library plans the box (and refuses packed runs that do not fall on byte boundaries): one run is a byte
    # range of the file; more are strided runs that keep their box, and the range from the first to the last.
    plan = file.plan_slice(name, [slice(start, stop) for start, stop in box])
    begin, end = whole.begin + plan.source_begin, whole.begin + plan.source_end
    return Piece(whole.code, sub, begin, end, box if plan.run_count > 1 else None)


def _bounds(name: str, s: slice, count: int) -> Tuple[int, int]:
    if s.step is not None and s.step != 1:
        if s.step == 0:
            raise SafetensorError(f"invalid prefetch plan slice for {name}: slice step cannot be zero")
        raise SafetensorError(f"prefetch plan slices must have step 1, got {s.step} (tensor {name})")
    start = 0 if s.start is None else _bound(s.start, name)
    stop = count if s.stop is None else _bound(s.stop, name)
    start = start + count if start < 0 else start
    stop = stop + count if stop < 0 else stop
    if not 0 <= start <= stop <= count:
        raise SafetensorError(f"prefetch plan slice bounds for {name} are out of range (0..{count}): "
                              f"[{s.start}:{s.stop}] gives rows {start}..{stop}")
    return start, stop


def _bound(value: Any, name: str) -> int:
    try:
        return operator.index(value)
    except TypeError:
        raise SafetensorError(f"invalid prefetch plan slice for {name}: bounds must be integers") from None


def read_box(file: Any, name: str, box: Box, ptr: int) -> None:
    """Reads the box of tensor ``name`` (native values, packed C-contiguous) to the address ``ptr`` with the
    library's slice reader (strided runs, near ones read together, GIL released)."""
    file.read_slice(name, file.plan_slice(name, [slice(start, stop) for start, stop in box]), ptr)


def box_rows(box: Box, r0: int, r1: int) -> Box:
    """Rows [r0, r1) of the box's first dimension, as a box."""
    (start, _), rest = box[0], box[1:]
    return ((start + r0, start + r1),) + tuple(rest)


def row_bytes(code: str, shape: Tuple[int, ...]) -> int:
    """Bytes of one index of the first dimension of a packed piece of ``shape``."""
    inner = 1
    for n in shape[1:]:
        inner *= n
    return inner * DTYPES[code].bits // 8

