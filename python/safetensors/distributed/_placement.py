"""What part of a state dict's tensor one rank holds: a DTensor's local piece as a box of the full tensor.

A box is one ``(start, stop)`` per dimension of the full (global) tensor: the local shard is the full tensor's
``[start0:stop0, start1:stop1, ...]``, laid out C-contiguously. DTensor placements map to boxes through torch's
own ``compute_local_shape_and_global_offset`` (so uneven splits are cut exactly as ``torch.chunk`` cuts them,
and several ``Shard`` placements on one dimension nest as torch nests them). Only placements a file can hold are
accepted: ``Shard(d)`` and ``Replicate()``; ``Partial`` (a pending reduction) and ``_StridedShard`` (an
interleaved layout) are refused, naming the tensor. A plain tensor's box is the whole tensor.

Loading (``_state_dict``) and saving (``_save``) both start here, so a placement means the same thing both ways.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Optional, Tuple

import torch

from .._core import Box, SafetensorError

__all__ = ["LocalPiece", "box_slices", "box_shape", "is_whole", "local_piece"]


class LocalPiece(NamedTuple):
    """One state-dict entry on this rank."""

    shape: Tuple[int, ...]  # the full (global) tensor's shape
    dtype: torch.dtype
    box: Box  # what of the full tensor this rank holds
    local: torch.Tensor  # the rank's tensor holding the box (a DTensor's local tensor, or the plain tensor)
    #: True where this rank is the first of the ranks holding the same box: its coordinate is 0 on every mesh
    #: dimension the tensor is replicated over (plain tensors: every rank holds the whole tensor, so True
    #: everywhere; a saver picks one writer for those itself).
    primary: bool
    dtensor: bool


def _dtensor_type() -> Optional[type]:
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # torch built without distributed
        return None
    return DTensor


def local_piece(name: str, value: Any) -> LocalPiece:
    """``value`` (a DTensor or a plain tensor) as this rank's piece of tensor ``name``."""
    dtensor = _dtensor_type()
    if dtensor is not None and isinstance(value, dtensor):
        from torch.distributed.tensor import Replicate, Shard
        from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

        mesh, placements = value.device_mesh, tuple(value.placements)
        for p in placements:
            # _StridedShard subclasses Shard: its interleaved layout is no box of the full tensor.
            if not (type(p) is Shard or isinstance(p, Replicate)):
                raise SafetensorError(
                    f"tensor {name}: placement {p} cannot be loaded from or saved to a safetensors file (only "
                    f"Shard(dim) and Replicate() hold parts of the full tensor; redistribute it first)")
        shape = tuple(int(s) for s in value.shape)
        local_shape, offset = compute_local_shape_and_global_offset(value.shape, mesh, placements)
        box = tuple((int(o), int(o) + int(n)) for o, n in zip(offset, local_shape))
        coordinate = mesh.get_coordinate()
        primary = coordinate is not None and all(
            c == 0 for c, p in zip(coordinate, placements) if isinstance(p, Replicate))
        local = value.to_local()
        if coordinate is None:  # this rank is not in the tensor's mesh: it holds nothing of it
            box = tuple((0, 0) for _ in shape) if shape else ()
        return LocalPiece(shape, value.dtype, box, local, primary, True)
    if isinstance(value, torch.Tensor):
        shape = tuple(int(s) for s in value.shape)
        return LocalPiece(shape, value.dtype, tuple((0, s) for s in shape), value, True, False)
    raise SafetensorError(f"tensor {name}: state dict values must be torch tensors or DTensors, got "
                          f"{type(value).__name__}")


def box_shape(box: Box) -> Tuple[int, ...]:
    return tuple(stop - start for start, stop in box)


def box_slices(box: Box) -> Tuple[slice, ...]:
    return tuple(slice(start, stop) for start, stop in box)


def is_whole(box: Box, shape: Tuple[int, ...]) -> bool:
    return all(start == 0 and stop == size for (start, stop), size in zip(box, shape))
