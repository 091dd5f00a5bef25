"""numpy: save and load ``Dict[str, np.ndarray]``. Extended float types (bfloat16, float8, float6, float4) come
from ``ml_dtypes``; its 4- and 6-bit types hold one value per byte, so they are packed on save and unpacked
on load (low bits first, as the format stores them)."""

from __future__ import annotations

import sys
from typing import Any, Callable, Dict, FrozenSet, List, Tuple

import numpy as np

from . import _safetensors_cpp as _cpp
from ._adapter import save_load_functions
from ._core import DTYPES, Framework, SafetensorError
# Names the reference's module also offers (other projects import them from here).
from ._core import TensorSpec, deserialize, safe_open, serialize, serialize_file  # noqa: F401

__all__ = ["save", "save_file", "load", "load_file"]

# Bits per element of the packed (sub-byte) codes.
_PACKED_BITS = {code: row.bits for code, row in DTYPES.items() if row.bits % 8}


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
_TYPES: Dict[str, np.dtype] = _build_types()
_CODES: Dict[np.dtype, str] = {dtype: code for code, dtype in _TYPES.items()}


def _getdtype(dtype_str: str) -> np.dtype:
    return _TYPES[dtype_str]


def _np_dtype(code: str) -> np.dtype:
    dtype = _TYPES.get(code)
    if dtype is None:
        raise SafetensorError(f"dtype {code} has no numpy equivalent (install ml_dtypes for the extended float types)")
    return dtype


def _unpack(raw: np.ndarray, code: str, shape: Tuple[int, ...]) -> np.ndarray:
    """Sub-byte values, packed low bits first, to one value per byte."""
    bits = _PACKED_BITS[code]
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
    return out.view(_np_dtype(code)).reshape(shape)


def _pack(array: np.ndarray, code: str) -> np.ndarray:
    """One value per byte to the format's packed layout (the inverse of _unpack)."""
    bits = _PACKED_BITS[code]
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
_WHOLE: Dict[str, np.dtype] = {code: dtype for code, dtype in _TYPES.items() if code not in _PACKED_BITS}


class _Numpy(Framework):
    name = "numpy"

    def view(self, buffer: memoryview, code: str, shape: Tuple[int, ...]) -> np.ndarray:
        dtype = _WHOLE.get(code)
        if dtype is not None:
            return np.ndarray(shape, dtype, buffer)
        if code in _PACKED_BITS:
            return _unpack(np.frombuffer(buffer, dtype=np.uint8), code, shape)
        return np.ndarray(shape, _np_dtype(code), buffer)  # raises: no numpy dtype

    def empty(self, code: str, shape: Tuple[int, ...]) -> Tuple[np.ndarray, int]:
        if code in _PACKED_BITS:
            nbytes = int(np.prod(shape, dtype=np.uint64)) * _PACKED_BITS[code] // 8
            array = np.empty(nbytes, dtype=np.uint8)
        else:
            array = np.empty(shape, dtype=_np_dtype(code))
        return array, array.ctypes.data

    def finish(self, tensor: np.ndarray, code: str, shape: Tuple[int, ...]) -> np.ndarray:
        return _unpack(tensor, code, shape) if code in _PACKED_BITS else tensor

    def stack(self, tensors: List[np.ndarray], axis: int) -> np.ndarray:
        return np.stack(tensors, axis)


def codes_where(has: Callable[[str, np.dtype], bool]) -> FrozenSet[str]:
    """The format codes numpy holds (with ml_dtypes) for which ``has(code, numpy dtype)`` is true: a framework's
    support set, from the dtype table and what the framework itself reports."""
    return frozenset(code for code, dtype in _TYPES.items() if has(code, dtype))


class _Converted(_Numpy):
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


_ADAPTER = _Numpy()


def _flatten_specs(tensor_dict: Dict[str, np.ndarray]) -> Tuple[List[tuple], List[np.ndarray]]:
    """Checks arrays for saving and describes each by address: ``(specs, keep_alive)`` for serialize_flat,
    where keep_alive holds the little-endian, packed or contiguous copies the specs point into."""
    if not isinstance(tensor_dict, dict):
        raise ValueError(f"Expected a dict of [str, np.ndarray] but received {type(tensor_dict)}")
    specs = []
    keep_alive = []
    for name, array in tensor_dict.items():
        if not isinstance(array, np.ndarray):
            raise ValueError(f"Key `{name}` is invalid, expected np.ndarray but received {type(array)}")
        code = _CODES.get(array.dtype.newbyteorder("=")) if array.dtype.byteorder in "<>=|" else None
        if code is None:
            raise SafetensorError(f"tensor `{name}` has dtype {array.dtype}, which safetensors cannot store")
        shape = list(array.shape)
        if not array.dtype.isnative:
            # The writer takes native values (and writes them little-endian on any host).
            array = array.astype(array.dtype.newbyteorder("="))
        if code in _PACKED_BITS:
            array = _pack(array, code)
        else:
            array = np.ascontiguousarray(array)  # copies only what is not already C-contiguous
        keep_alive.append(array)
        specs.append((name, code, shape, array.ctypes.data if array.nbytes else 0, array.nbytes))
    return specs, keep_alive


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
    if code in _PACKED_BITS or not row.torch_name:
        return TensorSpec(dtype=array.dtype.name, shape=shape, data_ptr=data_ptr, data_len=data_len)
    return TensorSpec(dtype=row.torch_name, shape=shape, data_ptr=data_ptr, data_len=data_len)


def _flatten(tensor_dict: Dict[str, np.ndarray], keep_alive_buffer: List) -> Dict[str, TensorSpec]:
    """The reference's form: ``{name: TensorSpec}`` for serialize/serialize_file; the arrays the specs point
    into are appended to ``keep_alive_buffer``, which the caller keeps until the call returns."""
    specs, keep_alive = _flatten_specs(tensor_dict)
    keep_alive_buffer.extend(keep_alive)
    return {
        name: _tensor_spec(code, shape, ptr, nbytes, tensor_dict[name])
        for name, code, shape, ptr, nbytes in specs
    }


def _view2np(safeview: List[Tuple[str, Dict[str, Any]]]) -> Dict[str, np.ndarray]:
    """``deserialize`` output to ``{name: array}``; each array shares the memory of its ``data``."""
    return {name: _ADAPTER.view(v["data"], v["dtype"], tuple(v["shape"])) for name, v in safeview}


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


save, save_file, load, load_file = save_load_functions(
    __name__, "np", _ADAPTER, _flatten_specs, np.ndarray, "numpy.ndarray", tensors="tensor_dict"
)
