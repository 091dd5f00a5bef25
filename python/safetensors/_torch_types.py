"""torch's side of the dtype table: the torch dtype of each format code, and torch's shape of a header shape
(F4 is ``torch.float4_e2m1fn_x2``, two values per element of the last dimension: include/safetensors/dtype.h
states that rule). ``safetensors.torch``, prefetch, the distributed loader and the CLI build torch tensors
through these; the loads that fill new tensors allocate them here (``allocate``, ``byte_jobs``)."""

from __future__ import annotations

from typing import Any, Dict, List, Sequence, Tuple

import torch

from . import _safetensors_cpp as _cpp
from ._core import DTYPES, TORCH_PACKED, SafetensorError

__all__ = ["CODES", "SIZE", "TYPES", "allocate", "as_bytes", "byte_jobs", "empty", "header_shape", "torch_dtype",
           "torch_shape"]

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


def as_bytes(tensor: torch.Tensor) -> torch.Tensor:
    """A contiguous tensor's memory as a 1-d uint8 tensor (the same storage)."""
    return tensor.reshape(-1).view(torch.uint8)


def allocate(pieces: Sequence[Tuple[str, Any]], device: Any, file: Any = None) -> Tuple[List[torch.Tensor], List[int]]:
    """A new tensor on ``device`` for each ``(name, _core.Piece)`` of ``pieces``, in order, and the indices of the
    pieces that are one contiguous run holding bytes (the ones the engine fills; see ``byte_jobs``). On the CPU,
    the tensors of ``file`` when it reads with O_DIRECT are placed where its direct reads land without a bounce
    (``File.destination``)."""
    direct = file is not None and file.backend == "direct" and torch.device(device).type == "cpu"
    tensors = []
    runs = []
    for i, (_, piece) in enumerate(pieces):
        code, shape, begin, end, box = piece
        if direct and end > begin and box is None:
            raw = torch.from_dlpack(file.destination(begin, end - begin))
            tensors.append(raw.view(torch_dtype(code)).reshape(torch_shape(code, shape)))
        else:
            tensors.append(empty(code, shape, device))
        if end > begin and box is None:
            runs.append(i)
    return tensors, runs


def byte_jobs(tensors: Sequence[torch.Tensor], pieces: Sequence[Tuple[str, Any]],
              runs: Sequence[int]) -> List[Tuple[torch.Tensor, int, int]]:
    """The engine's jobs (``_engine.Job``) filling the ``runs`` of ``allocate``: each tensor's memory as 1-d
    uint8, with its piece's data-buffer range."""
    return [(as_bytes(tensors[i]), pieces[i][1].begin, pieces[i][1].end) for i in runs]
