"""torch's side of the dtype table: the torch dtype of each format code, and torch's shape of a header shape
(F4 is ``torch.float4_e2m1fn_x2``, two values per element of the last dimension: include/safetensors/dtype.h
states that rule). ``safetensors.torch``, prefetch, the distributed loader and the CLI build torch tensors
through these."""

from __future__ import annotations

from typing import Any, Dict, List, Tuple

import torch

from . import _safetensors_cpp as _cpp
from ._core import DTYPES, TORCH_PACKED, SafetensorError

__all__ = ["CODES", "SIZE", "TYPES", "empty", "header_shape", "torch_dtype", "torch_shape"]

#: Format code -> torch dtype, for every code torch can hold.
TYPES: Dict[str, torch.dtype] = {
    row.code: getattr(torch, row.torch_name)
    for row in DTYPES.values()
    if row.torch_name and hasattr(torch, row.torch_name)
}
#: torch dtype -> format code.
CODES: Dict[torch.dtype, str] = {dtype: code for code, dtype in TYPES.items()}
#: torch dtype -> bytes per element (float4_e2m1fn_x2 holds two values in one byte).
SIZE: Dict[torch.dtype, int] = {dtype: dtype.itemsize for dtype in TYPES.values()}


def torch_dtype(code: str) -> torch.dtype:
    """The torch dtype of a format code; SafetensorError where this torch has none."""
    dtype = TYPES.get(code)
    if dtype is None:
        raise SafetensorError(f"dtype {code} has no torch equivalent in torch {torch.__version__}")
    return dtype


def torch_shape(code: str, shape: Tuple[int, ...]) -> Tuple[int, ...]:
    """Header (logical) shape -> torch's shape; SafetensorError where torch cannot hold it."""
    return shape if code not in TORCH_PACKED else tuple(_cpp.torch_shape(code, list(shape)))


def header_shape(name: str, code: str, tensor: torch.Tensor) -> List[int]:
    """torch's shape of ``tensor`` (named ``name``) -> the header (logical) shape; ValueError for a packed scalar,
    which has no shape to hold its values."""
    shape = list(tensor.shape)
    if code not in TORCH_PACKED:
        return shape
    try:
        return _cpp.header_shape(code, shape)
    except ValueError as e:
        raise ValueError(f"tensor `{name}`: {e}") from None


def empty(code: str, shape: Tuple[int, ...], device: Any) -> torch.Tensor:
    """A new tensor for a header entry of ``code`` and ``shape`` on ``device`` (an explicit device: loading
    ignores torch's default-device context)."""
    return torch.empty(torch_shape(code, shape), dtype=torch_dtype(code), device=device)
