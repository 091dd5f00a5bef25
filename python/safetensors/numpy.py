"""numpy: save and load ``Dict[str, np.ndarray]``. Extended float types (bfloat16, float8, float6, float4) come
from ``ml_dtypes``; how arrays and the format meet is ``_numpy_bridge.py``."""

from __future__ import annotations

import sys
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from . import _framework
from . import _safetensors_cpp as _cpp
from ._core import DTYPES, PathLike, SafetensorError, StorageOptions
# Names the reference's module also offers (other projects import them from here).
from ._core import TensorSpec, deserialize, serialize, serialize_file  # noqa: F401
from ._numpy_bridge import NUMPY, PACKED_BITS, flatten_specs
from ._numpy_bridge import TYPES as _TYPES
from ._safe_open import safe_open  # noqa: F401

__all__ = ["save", "save_file", "load", "load_file"]

#: How ``safe_open(framework="np")`` builds arrays.
FRAMEWORK = NUMPY


def save(tensor_dict: Dict[str, np.ndarray], metadata: Optional[Dict[str, str]] = None) -> bytes:
    """The bytes of a safetensors file holding ``tensor_dict`` (a dict of ``numpy.ndarray`` by name)."""
    return _framework.save(flatten_specs, tensor_dict, metadata)


def save_file(tensor_dict: Dict[str, np.ndarray], filename: PathLike, metadata: Optional[Dict[str, str]] = None, *,
              fsync: bool = False) -> None:
    """Writes ``tensor_dict`` (a dict of ``numpy.ndarray`` by name) to ``filename`` atomically: a temporary file
    in the same directory, renamed over it, each array streamed from its own memory. ``fsync=True`` also makes
    the new file durable before returning."""
    _framework.save_file(flatten_specs, tensor_dict, filename, metadata, fsync)


def load(data: bytes) -> Dict[str, np.ndarray]:
    """Every array of the file in ``data``, in memory of its own."""
    return _framework.load(FRAMEWORK, data, "cpu")


def load_file(filename: PathLike, *, backend: str = "mmap",
              storage_options: Optional[StorageOptions] = None) -> Dict[str, np.ndarray]:
    """Every array of ``filename``, in file order. ``backend``: ``"mmap"`` (copy-on-write views of the mapped
    file), ``"pread"`` (positional reads into memory of their own, through the page cache), ``"direct"`` (the
    same past the page cache, O_DIRECT) or ``"auto"`` (per file: direct for a large file the cache does not
    hold). ``filename`` may be an ``s3://`` or ``https://`` URL (``storage_options`` as for ``safe_open``)."""
    return _framework.load_file("np", filename, "cpu", backend, storage_options)


# -- the reference's helpers, which other projects import -------------------------------------------------------

def _getdtype(dtype_str: str) -> np.dtype:
    return _TYPES[dtype_str]


def _tensor_spec(code: str, shape: List[int], data_ptr: int, data_len: int, array: np.ndarray) -> TensorSpec:
    """The TensorSpec of one flattened array. TensorSpec takes torch's dtype names, so F4 goes by its packed
    (x2) form, whose last dimension it doubles back; a code TensorSpec cannot name (F6, an odd F4 row) raises
    the reference's error for the array's own dtype name."""
    row = DTYPES[code]
    if row.torch_pack > 1:
        try:
            packed = _cpp.torch_shape(code, shape)
        except SafetensorError:
            packed = None  # no packed form: named by the array's own dtype below
        if packed is not None:
            return TensorSpec(dtype=row.torch_name, shape=packed, data_ptr=data_ptr, data_len=data_len)
    if code in PACKED_BITS or not row.torch_name:
        return TensorSpec(dtype=array.dtype.name, shape=shape, data_ptr=data_ptr, data_len=data_len)
    return TensorSpec(dtype=row.torch_name, shape=shape, data_ptr=data_ptr, data_len=data_len)


def _flatten(tensor_dict: Dict[str, np.ndarray], keep_alive_buffer: List) -> Dict[str, TensorSpec]:
    """The reference's form: ``{name: TensorSpec}`` for serialize/serialize_file; the arrays the specs point
    into are appended to ``keep_alive_buffer``, which the caller keeps until the call returns."""
    specs, keep_alive = flatten_specs(tensor_dict)
    keep_alive_buffer.extend(keep_alive)
    return {
        name: _tensor_spec(code, shape, ptr, nbytes, tensor_dict[name])
        for name, code, shape, ptr, nbytes in specs
    }


def _view2np(safeview: List[Tuple[str, Dict[str, Any]]]) -> Dict[str, np.ndarray]:
    """``deserialize`` output to ``{name: array}``; each array shares the memory of its ``data``."""
    return {name: FRAMEWORK.view(v["data"], v["dtype"], tuple(v["shape"])) for name, v in safeview}


def _is_little_endian(tensor: np.ndarray) -> bool:
    """True when the array's bytes are little-endian (native order on a little-endian host, or no order)."""
    order = tensor.dtype.byteorder
    if order == "=":
        return sys.byteorder == "little"
    if order in ("<", "|"):
        return True
    if order == ">":
        return False
    raise ValueError(f"Unexpected byte order {order}")
