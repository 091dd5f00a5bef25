"""Python index expressions -> the native slicer's spec, with numpy semantics.

The C++ slicer handles integers, ranges and Ellipsis. Two numpy features are layered on top here, because
they only rearrange what the slicer reads: ``None`` (a new axis of length 1) and one integer list (numpy's
single advanced index: one read per listed position, stacked where the list stood). ``[]`` is an empty
list, i.e. an empty first axis.
"""

from __future__ import annotations

import operator
from typing import Any, List, Optional, Sequence, Tuple

from ._safetensors_cpp import SafetensorSliceError

# Native spec entries: (0, i, None, None) integer, (1, start, stop, step) range, (2, None, None, None) ellipsis.
_ELLIPSIS = (2, None, None, None)


def _as_int(value: Any) -> Optional[int]:
    if isinstance(value, bool):
        return None
    try:
        return operator.index(value)
    except TypeError:
        return None


def _as_int_list(value: Any) -> Optional[List[int]]:
    if isinstance(value, (list, tuple, range)):
        items = list(value)
    elif hasattr(value, "tolist") and getattr(value, "ndim", None) == 1:
        items = value.tolist()
    else:
        return None
    out = []
    for item in items:
        i = _as_int(item)
        if i is None:
            return None
        out.append(i)
    return out


def _invalid(value: Any) -> SafetensorSliceError:
    return SafetensorSliceError(
        "only integers, slices (`:`), ellipsis (`...`), None and integer lists are valid indices "
        f"(got {type(value).__name__})"
    )


class IndexPlan:
    """A parsed index expression: the native spec(s) to read and how to assemble the result."""

    __slots__ = ("spec", "gather_position", "gather_values", "gather_axis", "newaxes")

    def __init__(self) -> None:
        self.spec: List[tuple] = []
        self.gather_position: Optional[int] = None  # index into spec of the integer-list entry
        self.gather_values: List[int] = []
        self.gather_axis: Optional[int] = None  # axis of the read result where the list's axis goes
        self.newaxes: List[int] = []  # final positions of the length-1 axes, increasing

    @property
    def has_newaxis(self) -> bool:
        return bool(self.newaxes)

    def reads(self) -> List[List[tuple]]:
        """The native specs to read, in order: one, or one per listed position."""
        if self.gather_position is None:
            return [self.spec]
        out = []
        for value in self.gather_values:
            spec = list(self.spec)
            spec[self.gather_position] = (0, value, None, None)
            out.append(spec)
        return out

    def result_shape(self, read_shape: Sequence[int]) -> Tuple[int, ...]:
        """The final shape from the shape of the assembled reads (the stacked one when there is a list)."""
        shape = list(read_shape)
        for pos in self.newaxes:
            shape.insert(pos, 1)
        return tuple(shape)

    def meta_shape(self, one_read_shape: Sequence[int]) -> Tuple[int, ...]:
        """The final shape from the shape of one read, without reading."""
        shape = list(one_read_shape)
        if self.gather_axis is not None:
            shape.insert(self.gather_axis, len(self.gather_values))
        return self.result_shape(shape)


def parse_index(index: Any, ndim: int) -> IndexPlan:
    """Parses ``index`` for a tensor of ``ndim`` dimensions. Range and bounds errors are left to the native
    planner, which reports them with numpy's words."""
    if isinstance(index, tuple):
        items: Sequence[Any] = index
    else:
        items = (index,)

    plan = IndexPlan()
    kinds = []  # per item: "int", "slice", "list", "ellipsis", "none"
    for item in items:
        if item is None:
            kinds.append("none")
        elif item is Ellipsis:
            kinds.append("ellipsis")
        elif isinstance(item, slice):
            kinds.append("slice")
        elif _as_int(item) is not None:
            kinds.append("int")
        elif _as_int_list(item) is not None:
            kinds.append("list")
        else:
            raise _invalid(item)
    if kinds.count("ellipsis") > 1:
        raise SafetensorSliceError("an index can only have a single ellipsis ('...')")
    if kinds.count("list") > 1:
        raise SafetensorSliceError("only one integer-list (advanced) index is supported")
    explicit = sum(k in ("int", "slice", "list") for k in kinds)
    if explicit > ndim:
        raise SafetensorSliceError(
            f"too many indices for tensor: tensor is {ndim}-dimensional, but {explicit} were indexed"
        )

    out_axes = 0  # axes of the assembled read result produced so far
    for item, kind in zip(items, kinds):
        if kind == "none":
            plan.newaxes.append(out_axes + len(plan.newaxes))
        elif kind == "ellipsis":
            plan.spec.append(_ELLIPSIS)
            out_axes += ndim - explicit
        elif kind == "int":
            plan.spec.append((0, _as_int(item), None, None))
        elif kind == "slice":
            plan.spec.append(
                (1, _slice_bound(item.start), _slice_bound(item.stop), _slice_bound(item.step))
            )
            out_axes += 1
        else:
            values = _as_int_list(item)
            assert values is not None
            if values:
                plan.gather_position = len(plan.spec)
                plan.gather_values = values
                plan.gather_axis = out_axes
                plan.spec.append((0, values[0], None, None))
            else:
                plan.spec.append((1, 0, 0, None))  # an empty list selects nothing along its axis
            out_axes += 1
    return plan


def _slice_bound(value: Any) -> Optional[int]:
    if value is None:
        return None
    i = _as_int(value)
    if i is None:
        raise SafetensorSliceError(
            f"slice indices must be integers or None or have an __index__ method (got {type(value).__name__})"
        )
    # The native planner takes 64-bit bounds; Python's clamping makes anything larger equivalent to the limit.
    return max(-(2**63), min(i, 2**63 - 1))
