"""Python index expressions -> the native slicer's spec, with numpy semantics.

The C++ slicer takes Python integers, slices and Ellipsis as they are, and checks them (bounds, steps, slice
bounds that are not integers, a second Ellipsis, too many indices). Two numpy features are layered on top
here, because they only rearrange what the slicer reads: ``None`` (a new axis of length 1) and one integer
list (numpy's single advanced index: one read per listed position, stacked where the list stood). ``[]`` is
an empty list, i.e. an empty first axis.
"""

from __future__ import annotations

import operator
from typing import Any, List, Optional, Sequence, Tuple

from ._safetensors_cpp import SafetensorSliceError

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
    """A parsed index expression: the native spec(s) to read and how to assemble the result.

    ``slots`` lists the result's axes in order: ``"S"`` an axis of the native read, ``"G"`` the integer list's
    axis, ``"N"`` a new axis of length 1. As in numpy, the list's axis stands where the list stood, unless
    integer indices separated from it by other entries make it an advanced index that is not contiguous --
    then its axis comes first.
    """

    __slots__ = ("spec", "gather_position", "gather_values", "slots", "moved_empty_axis", "lists")

    def __init__(self) -> None:
        self.spec: List[Any] = []  # what the native slicer reads: ints, slices and Ellipsis
        self.gather_position: Optional[int] = None  # index into spec of the integer-list entry
        self.gather_values: List[int] = []
        self.slots: List[str] = []
        # An empty list is read as an empty range; when numpy would move its axis to the front, this is that
        # axis's position in the native read (the result is empty, so moving it is only a reshape).
        self.moved_empty_axis: Optional[int] = None
        self.lists = False  # whether the index has an integer list (an empty one included)

    @property
    def gather_axis(self) -> Optional[int]:
        """Axis of the stacked reads where the list's axis goes (None without a list)."""
        if self.gather_position is None:
            return None
        return [slot for slot in self.slots if slot != "N"].index("G")

    def reads(self) -> List[List[Any]]:
        """The native specs to read, in order: one, or one per listed position."""
        if self.gather_position is None:
            return [self.spec]
        out = []
        for value in self.gather_values:
            spec = list(self.spec)
            spec[self.gather_position] = value
            out.append(spec)
        return out

    @property
    def needs_reshape(self) -> bool:
        return "N" in self.slots or self.moved_empty_axis is not None

    def result_shape(self, read_shape: Sequence[int]) -> Tuple[int, ...]:
        """The final shape from the shape of the assembled reads (the stacked one when there is a list)."""
        dims = list(read_shape)
        if self.moved_empty_axis is not None:
            dims.insert(0, dims.pop(self.moved_empty_axis))
        it = iter(dims)
        return tuple(1 if slot == "N" else next(it) for slot in self.slots)

    def meta_shape(self, one_read_shape: Sequence[int]) -> Tuple[int, ...]:
        """The final shape from the shape of one read, without reading."""
        if self.gather_position is None:
            return self.result_shape(one_read_shape)
        dims = iter(one_read_shape)
        return tuple(
            1 if slot == "N" else len(self.gather_values) if slot == "G" else next(dims) for slot in self.slots
        )


def parse_index(index: Any, ndim: int) -> IndexPlan:
    """Parses ``index`` for a tensor of ``ndim`` dimensions. Range, bounds and count errors are left to the
    native planner, which reports them with numpy's words."""
    if isinstance(index, tuple):
        items: Sequence[Any] = index
    else:
        items = (index,)

    plan = IndexPlan()
    kinds = []  # per item: "int", "slice", "list", "ellipsis", "none"
    for item in items:
        if item is None or item is True:  # numpy and torch: True is a new axis of length 1, like None
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
    if kinds.count("list") > 1:
        raise SafetensorSliceError("only one integer-list (advanced) index is supported")
    plan.lists = "list" in kinds
    explicit = sum(k in ("int", "slice", "list") for k in kinds)

    for item, kind in zip(items, kinds):
        if kind == "none":
            plan.slots.append("N")
        elif kind == "ellipsis":
            plan.spec.append(Ellipsis)
            plan.slots.extend("S" * (ndim - explicit))
        elif kind == "int":
            plan.spec.append(_as_int(item))
        elif kind == "slice":
            plan.spec.append(item)
            plan.slots.append("S")
        else:
            values = _as_int_list(item)
            assert values is not None
            if values:
                plan.gather_position = len(plan.spec)
                plan.gather_values = values
                plan.spec.append(values[0])
                plan.slots.append("G")
            else:
                plan.spec.append(slice(0, 0))  # an empty list selects nothing along its axis
                empty_list_axis = plan.slots.count("S")
                plan.slots.append("S")

    if "ellipsis" not in kinds:
        plan.slots.extend("S" * (ndim - explicit))  # axes not indexed are taken whole, after the rest

    advanced = [i for i, k in enumerate(kinds) if k in ("int", "list")]
    if "list" in kinds and advanced[-1] - advanced[0] + 1 != len(advanced):
        if plan.gather_position is not None:
            plan.slots.remove("G")
            plan.slots.insert(0, "G")
        else:
            plan.moved_empty_axis = empty_list_axis
            plan.slots.insert(0, plan.slots.pop(_nth_s(plan.slots, empty_list_axis)))
    return plan


def _nth_s(slots: List[str], n: int) -> int:
    """Position in ``slots`` of the n-th read axis."""
    seen = -1
    for i, slot in enumerate(slots):
        if slot == "S":
            seen += 1
            if seen == n:
                return i
    raise AssertionError("no such read axis")
