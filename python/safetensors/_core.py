"""The framework-independent base every other module builds on: the dtype table's rows, the byte order,
``Piece`` (a tensor's dtype, shape and byte range: the record every load passes around), ``TensorSpec`` with ``serialize``/``serialize_file``/``deserialize``, ``TensorMeta``, and small helpers.

It talks to the C++ library through ``_safetensors_cpp`` and imports no other module of the package: it knows no
framework (``safe_open`` is in ``_safe_open.py``, what a framework module is made of in ``_framework.py``).
"""

from __future__ import annotations

import contextlib
import gc
import os
import sys
import threading
from typing import Any, Dict, FrozenSet, List, Mapping, NamedTuple, Optional, Sequence, Tuple, Union

from . import _safetensors_cpp as _cpp
from ._safetensors_cpp import SafetensorError, SafetensorIOError, SafetensorSliceError

__all__ = [
    "DTYPES",
    "HOST_SWAPS",
    "Box",
    "DtypeRow",
    "Flattened",
    "PathLike",
    "Piece",
    "SafetensorError",
    "SafetensorIOError",
    "SafetensorSliceError",
    "TORCH_PACKED",
    "TensorMeta",
    "TensorSpec",
    "deserialize",
    "fspath",
    "gc_paused",
    "open_bytes",
    "serialize",
    "serialize_file",
    "serialize_flat",
    "serialize_flat_file",
    "to_little_endian",
]

PathLike = Union[str, "os.PathLike[str]"]

#: SafetensorIOError's subclasses by name, one per OSError subclass Python picks by errno: an I/O error is the
#: one of its errno (SafetensorPermissionError for EACCES and EPERM: also a PermissionError, ...), else a plain
#: SafetensorIOError. Made by the native module (python/src/errors.cc), which raises them.
IO_ERRORS: Dict[str, type] = {cls.__name__: cls for cls in SafetensorIOError.__subclasses__()}


class DtypeRow(NamedTuple):
    """One row of the C++ dtype table (include/safetensors/dtype.h has what each field means)."""

    code: str
    bits: int
    kind: str  # "bool", "signed", "unsigned", "float" or "complex"
    swap_bytes: int
    dlpack_code: Optional[int]
    torch_pack: int
    torch_name: str
    numpy_name: str


#: The one dtype table, read from the C++ library, in rank order.
DTYPES: Dict[str, DtypeRow] = {row[0]: DtypeRow(*row) for row in _cpp.dtype_table()}
_CODE_BY_TORCH_NAME: Dict[str, str] = {r.torch_name: r.code for r in DTYPES.values() if r.torch_name}

#: Codes whose bytes in a file are not this host's values: the multi-byte types on a big-endian host. Their
#: tensors are never views of a file: they are read into memory of their own, where the C++ library swaps
#: them (every read into caller memory gives native values; the binding's view/view_all give None for them),
#: and saving swaps back on the way out.
HOST_SWAPS: FrozenSet[str] = frozenset(
    code for code, row in DTYPES.items() if row.swap_bytes and sys.byteorder == "big"
)

#: A region of a tensor: one (start, stop) per dimension, in elements.
Box = Tuple[Tuple[int, int], ...]


class Piece(NamedTuple):
    """A tensor, or the part of one that a load plan selects (engine.h's Piece where it is one byte range):
    ``(code, shape, begin, end)`` as ``File.info`` gives a whole tensor, plus the ``box`` of a part that is not
    one contiguous run.

    ``shape`` is the shape of what it holds; ``begin``/``end`` are data-buffer offsets: the bytes it holds when
    ``box`` is None, else the span its strided runs lie in (``end > begin`` exactly when it holds bytes).
    ``box`` (one (start, stop) per dimension) is set only for a piece that is not one contiguous run."""

    code: str
    shape: Tuple[int, ...]
    begin: int
    end: int
    box: Optional[Box] = None

    @property
    def nbytes(self) -> int:
        """The bytes the piece holds (packed, C-contiguous)."""
        if self.box is None:
            return self.end - self.begin
        count = 1
        for n in self.shape:
            count *= n
        return count * DTYPES[self.code].bits // 8

#: Codes whose torch type packs several values per element (F4 as float4_e2m1fn_x2): their shapes convert by the
#: dtype table's rule (include/safetensors/dtype.h's torch_shape and header_shape).
TORCH_PACKED = frozenset(code for code, row in DTYPES.items() if row.torch_pack != 1)


def to_little_endian(data: Any, code: str) -> bytes:
    """The file's bytes for native values of ``code`` (a bytes-like object of whole elements): a byte-swapped
    copy on a big-endian host (``data`` is left as it is; the library's swap), the bytes themselves elsewhere."""
    if code not in HOST_SWAPS:
        return bytes(data)
    units = bytearray(data)
    _cpp.byteswap(units, DTYPES[code].swap_bytes)
    return bytes(units)


def fspath(filename: Any) -> str:
    """A path argument (str, bytes or os.PathLike) as the str the native library takes."""
    path = os.fspath(filename)
    return path.decode() if isinstance(path, bytes) else path


#: What ``storage_options`` may hold, for remote locations (``s3://``, ``https://``): the C++ library's
#: RemoteOptions (include/safetensors/remote.h), parsed there. ``headers`` is a ``{name: value}`` dict.
StorageOptions = Mapping[str, Any]


def remote_pairs(storage_options: Optional[StorageOptions]) -> List[Tuple[str, str]]:
    """``storage_options`` as the ``(option, value)`` text pairs the native opens take (RemoteOptions::set, the
    one parser, checks names and values): booleans as ``true``/``false``, ``headers`` one pair per header."""
    if storage_options is None:
        return []
    if not isinstance(storage_options, Mapping):
        raise TypeError(f"storage_options must be a dict, not {type(storage_options).__name__}")
    pairs: List[Tuple[str, str]] = []
    for key, value in storage_options.items():
        if key == "headers":
            pairs.extend(("header", f"{name}: {text}") for name, text in dict(value).items())
        elif isinstance(value, bool):
            pairs.append((str(key), "true" if value else "false"))
        else:
            pairs.append((str(key), str(value)))
    return pairs


# gc_paused's state: the collector is process-wide, and loads on several threads pause it at once. The first
# to enter disables it (noting whether it was enabled), the last to leave restores it; the GIL is not the lock.
_gc_lock = threading.Lock()
_gc_pausers = 0
_gc_was_enabled = False


@contextlib.contextmanager
def gc_paused():
    """Pauses the cyclic garbage collector while thousands of tensors are built: their containers are not
    garbage, and repeated collections over them would cost more than building them (4x on 20k tensors).
    Thread-safe: the collector runs again once every thread in here has left."""
    global _gc_pausers, _gc_was_enabled
    with _gc_lock:
        if _gc_pausers == 0:
            _gc_was_enabled = gc.isenabled()
            gc.disable()
        _gc_pausers += 1
    try:
        yield
    finally:
        with _gc_lock:
            _gc_pausers -= 1
            if _gc_pausers == 0 and _gc_was_enabled:
                gc.enable()


class _HeaderDtypeShape:
    """What :class:`TensorMeta` and :class:`TensorSpec` share: a tensor's dtype and shape as the header has them.
    Subclasses set ``_dtype`` and ``_shape``."""

    __slots__ = ("_dtype", "_shape")

    _dtype: str
    _shape: List[int]

    @property
    def dtype(self) -> str:
        """The format code in the header, e.g. ``"F32"``."""
        return self._dtype

    @property
    def shape(self) -> List[int]:
        return list(self._shape)


class TensorMeta(_HeaderDtypeShape):
    """A tensor's header entry, as written in the file: ``dtype`` (the code, e.g. ``"F32"``), ``shape`` and
    ``data_offsets`` (``(begin, end)`` within the data buffer). Built without reading any data."""

    __slots__ = ("_offsets",)

    def __init__(self, dtype: str, shape: List[int], data_offsets: Tuple[int, int]) -> None:
        self._dtype = dtype
        self._shape = shape
        self._offsets = data_offsets

    @property
    def data_offsets(self) -> Tuple[int, int]:
        return self._offsets

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, TensorMeta):
            return NotImplemented
        return (self._dtype, self._shape, self._offsets) == (other._dtype, other._shape, other._offsets)

    def __hash__(self) -> int:
        return hash((self._dtype, tuple(self._shape), self._offsets))

    def __repr__(self) -> str:
        shape = ", ".join(str(d) for d in self._shape)
        return (f'TensorMeta {{ dtype: "{self._dtype}", shape: [{shape}], data_offsets: '
                f"({self._offsets[0]}, {self._offsets[1]}) }}")


class TensorSpec(_HeaderDtypeShape):
    """One tensor for :func:`serialize` / :func:`serialize_file`: raw memory described by a torch-style dtype
    name and a shape. The caller keeps ``data_ptr`` valid until the call returns.

    For ``float4_e2m1fn_x2`` the storage shape (two values per byte) is accepted and the last dimension is
    doubled, so ``shape`` is always the logical element count written to the header.
    """

    __slots__ = ("_data_ptr", "_data_len")

    def __init__(self, *, dtype: str, shape: Sequence[int], data_ptr: int, data_len: int) -> None:
        code = _CODE_BY_TORCH_NAME.get(dtype) if isinstance(dtype, str) else None
        if code is None:
            supported = ", ".join(r.torch_name for r in DTYPES.values() if r.torch_name)
            raise SafetensorError(f'Unknown dtype "{dtype}". Supported dtypes: {supported}')
        dims = [int(d) for d in shape]
        if dims and code in TORCH_PACKED:
            dims = _cpp.header_shape(code, dims)  # a packed torch type (F4's x2) names storage, not values
        self._dtype = code
        self._shape = dims
        self._data_ptr = int(data_ptr)
        self._data_len = int(data_len)

    @property
    def data_ptr(self) -> int:
        return self._data_ptr

    @property
    def data_len(self) -> int:
        return self._data_len

    def __repr__(self) -> str:
        return f"TensorSpec(dtype={self._dtype!r}, shape={self._shape}, data_ptr={self._data_ptr:#x}, data_len={self._data_len})"


def _specs(tensor_dict: Mapping[str, TensorSpec]) -> List[tuple]:
    if not isinstance(tensor_dict, Mapping):
        raise TypeError(f"argument 'tensor_dict': '{type(tensor_dict).__name__}' object is not a dict")
    out = []
    for name, spec in tensor_dict.items():
        if not isinstance(spec, TensorSpec):
            raise TypeError(f"argument 'tensor_dict': '{type(spec).__name__}' object is not an instance of 'TensorSpec'")
        out.append((name, spec._dtype, spec._shape, spec._data_ptr, spec._data_len))
    return out


def _metadata(metadata: Optional[Mapping[str, str]]) -> Optional[List[Tuple[str, str]]]:
    if metadata is None:
        return None
    items = list(metadata.items())
    for key, value in items:
        if not isinstance(key, str) or not isinstance(value, str):
            raise TypeError(
                f"metadata must map str to str, got {type(key).__name__} -> {type(value).__name__} for key {key!r}"
            )
    return items


def serialize(tensor_dict: Dict[str, TensorSpec], metadata: Optional[Dict[str, str]] = None) -> bytes:
    """Serializes raw tensors (see :class:`TensorSpec`) to the bytes of a safetensors file."""
    return _cpp.serialize(_specs(tensor_dict), _metadata(metadata))


def serialize_file(
    tensor_dict: Dict[str, TensorSpec],
    filename: PathLike,
    metadata: Optional[Dict[str, str]] = None,
    *,
    fsync: bool = False,
) -> None:
    """Writes raw tensors to ``filename`` atomically (temporary file + rename); ``fsync=True`` also makes the
    new file durable before returning."""
    _cpp.serialize_file(_specs(tensor_dict), fspath(filename), _metadata(metadata), fsync)


Flattened = Tuple[List[tuple], List[Any]]


def serialize_flat(flat: Flattened, metadata: Optional[Mapping[str, str]]) -> bytes:
    """The bytes of a file from ``(specs, keep_alive)`` as a framework's ``_flatten`` makes them: specs of
    ``(name, code, shape, data_ptr, data_len)``, and the objects that keep those pointers valid meanwhile."""
    specs, keep_alive = flat
    return _cpp.serialize(specs, _metadata(metadata))


def serialize_flat_file(flat: Flattened, filename: PathLike, metadata: Optional[Mapping[str, str]], fsync: bool) -> None:
    """Writes ``(specs, keep_alive)`` (see serialize_flat) to ``filename`` atomically."""
    specs, keep_alive = flat
    _cpp.serialize_file(specs, fspath(filename), _metadata(metadata), fsync)
def deserialize(bytes: Union[bytes, bytearray, memoryview]) -> List[Tuple[str, Dict[str, Any]]]:
    """Parses and validates the bytes of a file: ``[(name, {"dtype", "shape", "data": bytearray})]`` in file
    order."""
    file = _cpp.File.from_buffer(bytes)
    mv = memoryview(file.buffer())
    return [
        (name, {"dtype": code, "shape": list(shape), "data": bytearray(mv[begin:end])})
        for name, (code, shape, begin, end) in file.infos()
    ]


def open_bytes(data: Any) -> _cpp.File:
    """A validated in-memory file over a bytes-like object; errors use the reference's bytes prefix."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise TypeError(f"argument 'bytes': '{type(data).__name__}' object is not an instance of 'bytes'")
    return _cpp.File.from_buffer(data)
