"""The reference's words for index expressions it refuses, so that ``str(e)`` matches it exactly.

Our slicer (numpy semantics, ``_slicing.py`` + the C++ planner) decides what is accepted; this module only
says, once the slicer has refused an index, what text the reference raises for that same index -- or None
where the reference would have accepted it (then our own text stands). The reference has two indexers:

- ``framework="pt"`` with ``backend="mmap"`` indexes a torch tensor: its errors are torch's, obtained here by
  applying the index to a meta tensor of the same shape (no memory, no data).
- every other framework and backend uses its own Rust indexer, modelled by :func:`rust_indexer_error`:
  one pass over the items that converts them (ellipsis count, item types, step sign, negative indices) and
  then a check of the expanded spec against the shape, from the last dimension to the first.
"""

from __future__ import annotations

import operator
from typing import Any, List, Optional, Sequence

_I64 = 2**63
_U64 = 2**64


def _as_int(item: Any) -> Optional[int]:
    try:
        return operator.index(item)  # bools are ints to the reference's converter
    except TypeError:
        return None


def _slice_text(start: Optional[int], stop: Optional[int], step: Optional[int]) -> str:
    text = f"{'' if start is None else start}:{'' if stop is None else stop}"
    if step is not None and step != 1:
        text += f":{step}"
    return text


def rust_indexer_error(index: Any, shape: Sequence[int]) -> Optional[str]:
    """The reference's Rust-indexer error text for ``index`` on a tensor of ``shape``, or None if it accepts."""
    ndim = len(shape)
    if isinstance(index, list):
        # A bare list: empty selects nothing along the first axis, anything else is refused.
        if index:
            return "Non empty lists are not implemented"
        items: List[Any] = [slice(0, 0)]
    elif isinstance(index, tuple):
        items = list(index)
    else:
        items = [index]

    if sum(item is Ellipsis for item in items) > 1:
        return "Only one ellipsis (...) is allowed in slice index"
    fill = max(0, ndim - sum(item is not Ellipsis for item in items))

    # Pass 1: convert each item, left to right; `dim` counts axes with the ellipsis expanded.
    spec: List[tuple] = []  # ("int", i) or ("slice", start, stop, step)
    dim = 0
    for item in items:
        if item is Ellipsis:
            spec.extend([("slice", None, None, None)] * fill)
            dim += fill
            continue
        value = _as_int(item)
        if isinstance(item, slice):
            bounds = []
            for bound in (item.start, item.stop):
                b = None if bound is None else _as_int(bound)
                if bound is not None and b is None:
                    return f"Unsupported slice index at position {dim}: expected slice, int, or ellipsis"
                if b is not None and b < 0:
                    return "can't convert negative int to unsigned"
                if b is not None and b >= _U64:
                    return "int too big to convert"
                bounds.append(b)
            step = None if item.step is None else _as_int(item.step)
            if step is not None and step <= 0:
                return f"Slice step must be a positive integer, got {step}"
            spec.append(("slice", bounds[0], bounds[1], step))
        elif value is not None and -_I64 <= value < _I64:
            size = shape[dim] if dim < ndim else 0
            if value < 0:
                if value + size < 0:
                    return f"Invalid index {value} for dimension {dim} of size {size}"
                value += size
            spec.append(("int", value))
        else:
            return f"Unsupported slice index at position {dim}: expected slice, int, or ellipsis"
        dim += 1

    # Pass 2: the expanded spec against the shape.
    text = ", ".join(str(s[1]) if s[0] == "int" else _slice_text(*s[1:]) for s in spec)
    where = f"Error during slicing [{text}] with shape [{', '.join(str(d) for d in shape)}]"
    if len(spec) > ndim:
        return f"{where}: more slicing indexes than dimensions in tensor"
    for d in reversed(range(len(spec))):
        entry, size = spec[d], shape[d]
        asked = None
        if entry[0] == "int":
            if entry[1] >= size:
                asked = entry[1]
        else:
            start, stop = entry[1], entry[2]
            if start is not None and start >= size:
                asked = start
            elif stop is not None and stop > size:
                asked = stop - 1
        if asked is not None:
            return f"{where}: index {asked} out of bounds for tensor dimension #{d} of size {size}"
    return None


def torch_indexing_error(index: Any, shape: Sequence[int]) -> Optional[str]:
    """torch's error text for ``index`` on a tensor of ``shape``, or None if torch accepts it."""
    import warnings

    import torch

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch's deprecation warning for non-tuple sequences
            torch.empty(tuple(shape), dtype=torch.uint8, device="meta")[index]
    except (IndexError, ValueError, TypeError, RuntimeError) as e:
        return str(e)
    return None
