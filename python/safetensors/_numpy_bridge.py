"""The numpy bridge: numpy's side of the dtype table (extended float types from ``ml_dtypes``; its 4- and 6-bit
types hold one value per byte, so they are packed on save and unpacked on load, low bits first, as the format
stores them), the numpy ``Framework``, and ``NumpyBridged``, the documented base of the frameworks whose tensors
are numpy arrays converted once complete (flax, tensorflow, mlx, paddle).

A framework module built on it subclasses ``NumpyBridged``, sets ``label`` and ``codes`` (``codes_where``) and
``to_device`` (numpy array -> its tensor), and saves through ``flatten_specs`` after turning its tensors into
numpy arrays; reads, slices and the packed types are numpy's.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, FrozenSet, List, Tuple

import numpy as np

from ._framework import Framework
from ._core import DTYPES, HOST_SWAPS, SafetensorError, to_little_endian
from ._engine import host_view

__all__ = [
    "CODES",
    "NUMPY",
    "NumpyBridged",
    "NumpyFramework",
    "PACKED_BITS",
    "TYPES",
    "codes_where",
    "flatten_specs",
    "little_endian_bytes",
    "np_dtype",
    "pack",
    "unpack",
]

#: Bits per element of the packed (sub-byte) codes.
PACKED_BITS = {code: row.bits for code, row in DTYPES.items() if row.bits % 8}


def _ml_dtypes() -> Any:
    try:
        import ml_dtypes
    except ImportError:  # pragma: no cover - ml_dtypes is installed alongside numpy in tests
        return None
    return ml_dtypes


def _build_types() -> Dict[str, np.dtype]:
    types: Dict[str, np.dtype] = {}
    ml = _ml_dtypes()
    for code, row in DTYPES.items():
        name = row.numpy_name
        if name in ("bool",):
            types[code] = np.dtype(np.bool_)
        elif hasattr(np, name) and isinstance(getattr(np, name), type):
            types[code] = np.dtype(getattr(np, name))
        elif ml is not None and hasattr(ml, name):
            types[code] = np.dtype(getattr(ml, name))
    return types


#: Format code -> numpy dtype, for every code numpy (with ml_dtypes) can hold.
TYPES: Dict[str, np.dtype] = _build_types()
CODES: Dict[np.dtype, str] = {dtype: code for code, dtype in TYPES.items()}


def np_dtype(code: str) -> np.dtype:
    dtype = TYPES.get(code)
    if dtype is None:
        raise SafetensorError(f"dtype {code} has no numpy equivalent (install ml_dtypes for the extended float types)")
    return dtype


def unpack(raw: np.ndarray, code: str, shape: Tuple[int, ...]) -> np.ndarray:
    """Sub-byte values, packed low bits first, to one value per byte."""
    bits = PACKED_BITS[code]
    raw = raw.reshape(-1)
    if bits == 4:
        out = np.empty(raw.size * 2, dtype=np.uint8)
        out[0::2] = raw & 0x0F
        out[1::2] = raw >> 4
    else:  # 6 bits: four values in three bytes
        groups = raw.reshape(-1, 3).astype(np.uint32)
        word = groups[:, 0] | (groups[:, 1] << 8) | (groups[:, 2] << 16)
        out = np.empty((groups.shape[0], 4), dtype=np.uint8)
        for k in range(4):
            out[:, k] = (word >> (6 * k)) & 0x3F
    return out.view(np_dtype(code)).reshape(shape)


def pack(array: np.ndarray, code: str) -> np.ndarray:
    """One value per byte to the format's packed layout (the inverse of unpack)."""
    bits = PACKED_BITS[code]
    values = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
    if (values.size * bits) % 8:
        raise SafetensorError(f"a {code} tensor of {values.size} elements is not a whole number of bytes")
    if bits == 4:
        return ((values[0::2] & 0x0F) | ((values[1::2] & 0x0F) << 4)).astype(np.uint8)
    quads = (values.reshape(-1, 4) & 0x3F).astype(np.uint32)
    word = quads[:, 0] | (quads[:, 1] << 6) | (quads[:, 2] << 12) | (quads[:, 3] << 18)
    out = np.empty((quads.shape[0], 3), dtype=np.uint8)
    for k in range(3):
        out[:, k] = (word >> (8 * k)) & 0xFF
    return out.reshape(-1)


#: Codes stored one element per whole number of bytes, with their numpy dtype (the packed codes excluded).
_WHOLE: Dict[str, np.dtype] = {code: dtype for code, dtype in TYPES.items() if code not in PACKED_BITS}


class NumpyFramework(Framework):
    """numpy's Framework: tensors are numpy arrays, viewed over the file where a view is possible."""

    name = "numpy"

    def view(self, buffer: memoryview, code: str, shape: Tuple[int, ...]) -> np.ndarray:
        dtype = _WHOLE.get(code)
        if dtype is not None:
            return np.ndarray(shape, dtype, buffer)
        if code in PACKED_BITS:
            return unpack(np.frombuffer(buffer, dtype=np.uint8), code, shape)
        return np.ndarray(shape, np_dtype(code), buffer)  # raises: no numpy dtype

    def empty(self, code: str, shape: Tuple[int, ...]) -> Tuple[np.ndarray, int]:
        if code in PACKED_BITS:
            nbytes = int(np.prod(shape, dtype=np.uint64)) * PACKED_BITS[code] // 8
            array = np.empty(nbytes, dtype=np.uint8)
        else:
            array = np.empty(shape, dtype=np_dtype(code))
        return array, array.ctypes.data

    def finish(self, tensor: np.ndarray, code: str, shape: Tuple[int, ...]) -> np.ndarray:
        return unpack(tensor, code, shape) if code in PACKED_BITS else tensor

    def stack(self, tensors: List[np.ndarray], axis: int) -> np.ndarray:
        return np.stack(tensors, axis)


def codes_where(has: Callable[[str, np.dtype], bool]) -> FrozenSet[str]:
    """The format codes numpy holds (with ml_dtypes) for which ``has(code, numpy dtype)`` is true: a framework's
    support set, from the dtype table and what the framework itself reports."""
    return frozenset(code for code, dtype in TYPES.items() if has(code, dtype))


class NumpyBridged(NumpyFramework):
    """A framework whose tensors are numpy arrays converted once complete (``to_device``): reads, slices and
    the packed types are numpy's, and codes outside ``codes`` raise SafetensorError before anything is read."""

    #: The framework as "dtype X has no <label> equivalent" names it.
    label = "numpy"
    #: The codes the framework holds (see codes_where).
    codes: FrozenSet[str] = frozenset()

    def refusal(self, code: str) -> str:
        return f"dtype {code} has no {self.label} equivalent"

    def view(self, buffer: memoryview, code: str, shape: Tuple[int, ...]) -> Any:
        if code not in self.codes:
            raise SafetensorError(self.refusal(code))
        return super().view(buffer, code, shape)

    def empty(self, code: str, shape: Tuple[int, ...]) -> Tuple[Any, int]:
        if code not in self.codes:
            raise SafetensorError(self.refusal(code))
        return super().empty(code, shape)


NUMPY = NumpyFramework()


def flatten_specs(tensor_dict: Dict[str, np.ndarray]) -> Tuple[List[tuple], List[np.ndarray]]:
    """Checks arrays for saving and describes each by address: ``(specs, keep_alive)`` for serialize_flat,
    where keep_alive holds the little-endian, packed or contiguous copies the specs point into."""
    if not isinstance(tensor_dict, dict):
        raise ValueError(f"Expected a dict of [str, np.ndarray] but received {type(tensor_dict)}")
    specs = []
    keep_alive = []
    for name, array in tensor_dict.items():
        if not isinstance(array, np.ndarray):
            raise ValueError(f"Key `{name}` is invalid, expected np.ndarray but received {type(array)}")
        code = CODES.get(array.dtype.newbyteorder("=")) if array.dtype.byteorder in "<>=|" else None
        if code is None:
            raise SafetensorError(f"tensor `{name}` has dtype {array.dtype}, which safetensors cannot store")
        shape = list(array.shape)
        if not array.dtype.isnative:
            # The writer takes native values (and writes them little-endian on any host).
            array = array.astype(array.dtype.newbyteorder("="))
        if code in PACKED_BITS:
            array = pack(array, code)
        else:
            array = np.ascontiguousarray(array)  # copies only what is not already C-contiguous
        keep_alive.append(array)
        specs.append((name, code, shape, array.ctypes.data if array.nbytes else 0, array.nbytes))
    return specs, keep_alive


def little_endian_bytes(address: int, nbytes: int, code: str) -> np.ndarray:
    """A uint8 array over the ``nbytes`` bytes at ``address`` (memory the caller keeps alive) holding native
    values of ``code``, as the file stores them: the memory itself, without a copy, on a little-endian host; a
    byte-swapped copy where the host swaps ``code``."""
    data = np.frombuffer(host_view(address, nbytes), dtype=np.uint8)
    if code in HOST_SWAPS:  # the file's little-endian bytes, in a copy: the caller's memory is left as it is
        data = np.frombuffer(to_little_endian(data, code), dtype=np.uint8)
    return data
