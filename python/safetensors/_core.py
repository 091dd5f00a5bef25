"""The framework-independent Python surface: safe_open, serialize/deserialize, TensorSpec.

Everything here talks to the C++ library through ``_safetensors_cpp`` and to frameworks through one
``Framework`` adapter per framework (``safetensors.torch``, ``safetensors.numpy``, ...), so a framework module
only says how to build and unpack its tensors.
"""

from __future__ import annotations

import array
import contextlib
import gc
import importlib
import logging
import os
from typing import Any, Callable, Dict, List, Mapping, NamedTuple, Optional, Sequence, Tuple, Union

from . import _safetensors_cpp as _cpp
from ._safetensors_cpp import SafetensorError, SafetensorIOError, SafetensorSliceError
from . import _strategies
from ._prefetch import PrefetchLoader, TensorStream
from ._strategies import HOST_SWAPS, _Reader

__all__ = [
    "SafetensorError",
    "SafetensorIOError",
    "SafetensorSliceError",
    "PrefetchLoader",
    "PySafeSlice",
    "TensorMeta",
    "TensorSpec",
    "TensorStream",
    "deserialize",
    "safe_open",
    "_safe_open_handle",
    "serialize",
    "serialize_file",
]

PathLike = Union[str, "os.PathLike[str]"]


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

# array.array type codes by item size, for to_little_endian.
_UNIT_TYPECODES = {array.array(t).itemsize: t for t in "QLIH"}


def to_little_endian(data: Any, code: str) -> bytes:
    """The file's bytes for native values of ``code`` (a bytes-like object of whole elements): a byte-swapped
    copy on a big-endian host (``data`` is left as it is), the bytes themselves elsewhere."""
    if code not in HOST_SWAPS:
        return bytes(data)
    units = array.array(_UNIT_TYPECODES[DTYPES[code].swap_bytes])
    units.frombytes(data)
    units.byteswap()
    return units.tobytes()

_FRAMEWORK_MODULES = {
    "pt": "torch",
    "torch": "torch",
    "pytorch": "torch",
    "np": "numpy",
    "numpy": "numpy",
    "tf": "tensorflow",
    "tensorflow": "tensorflow",
    "flax": "flax",
    "jax": "flax",
    "mlx": "mlx",
    "paddle": "paddle",
}


def _fspath(filename: Any) -> str:
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


@contextlib.contextmanager
def gc_paused():
    """Pauses the cyclic garbage collector while thousands of tensors are built: their containers are not
    garbage, and repeated collections over them would cost more than building them (4x on 20k tensors)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


_log = logging.getLogger("safetensors")


def reading_backend(backend: Any, reads: bool) -> Any:
    """The backend a load opens its file with: ``backend``, except that ``"mmap"`` (the default, whose point is
    zero-copy CPU views) becomes ``"auto"`` where the load ``reads`` (a device load)."""
    return "auto" if reads and backend == "mmap" else backend


def log_source(file: "_cpp.File", backend: Any) -> None:
    """Says at debug level on the ``safetensors`` logger how a file opened with ``"direct"`` or ``"auto"`` is
    read: directly or through the page cache, what ``auto`` found cached, and a filesystem's refusal of
    O_DIRECT (which the source survives by reading through the cache)."""
    if backend not in ("direct", "auto") or not _log.isEnabledFor(logging.DEBUG):
        return
    stats = file.source_stats()
    how = "directly (O_DIRECT)" if file.backend == "direct" else "through the page cache"
    why = ""
    if stats["direct_refused"]:
        why = ": the filesystem refused O_DIRECT"
    elif backend == "auto" and stats["residency_probe"]:
        why = f": {stats['resident_bytes']} of {file.size} bytes cached ({stats['residency_probe']})"
    elif backend == "auto":
        why = ": too small to read directly, or its residency is unknown"
    _log.debug("safetensors: %s (backend %s) is read %s%s", file.path, backend, how, why)


def framework_adapter(framework: str) -> "Framework":
    """The adapter for a framework name (``pt``, ``np``, ...); SafetensorError for an unknown name."""
    module = _FRAMEWORK_MODULES.get(framework) if isinstance(framework, str) else None
    if module is None:
        raise SafetensorError(f"framework {framework} is invalid")
    return importlib.import_module(f"safetensors.{module}")._ADAPTER


class Framework:
    """How one framework builds and unpacks tensors: the primitives below. Which of them a load uses -- the
    loading strategy (zero-copy view, owned read, parallel read, staged to a device, meta) -- is chosen in
    one place, ``_strategies.py``, for every framework."""

    #: Name used in messages, as the reference spells it.
    name = "framework"
    #: Builds from DLPack capsules (from_dlpack, reinterpret, bytes_dtype) rather than from memoryviews (view).
    dlpack = False
    #: The dtype of a tensor exported as its bytes (a DLPack adapter's uint8).
    bytes_dtype: Any = None
    #: Whether to_device must run on CPU tensors too: set for adapters that build from memoryviews and whose
    #: to_device turns the host arrays into their own tensors (flax, tensorflow, mlx, paddle).
    wraps = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.wraps = not cls.dlpack and cls.to_device is not Framework.to_device

    # -- devices -------------------------------------------------------------------------------------
    def resolve_device(self, device: Any) -> Any:
        """The device tensors are delivered to; only the CPU unless a framework overrides this."""
        from ._devices import parse_reference_device

        spec = parse_reference_device(device)
        if spec != "cpu":
            # Spelled as the reference spells it: a bare type gets ":0", except mps, which has no index.
            kind, _, index = spec.partition(":")
            name = spec if kind.isdigit() else "mps" if kind == "mps" else f"{kind}:{index or 0}"
            raise SafetensorError(f"Device {name} is not supported for framework {self.name}")
        return "cpu"

    def is_cpu(self, device: Any) -> bool:
        return device == "cpu"

    def is_meta(self, device: Any) -> bool:
        return False

    def stages(self, device: Any) -> bool:
        """True where loads onto ``device`` go through ``stage`` (the loading engine)."""
        return False

    #: Whether slices selecting whole rows of the first dimension go through ``stage`` too.
    stages_rows = False

    def selects(self, code: str, shape: Tuple[int, ...]) -> bool:
        """Whether a selection inside staged rows of this tensor can be made on the device (``select``)."""
        return False

    def select(self, rows: Any, index: tuple) -> Any:
        """``rows[index]`` on the device, in memory of its own (where ``selects``)."""
        raise NotImplementedError

    # -- primitives ------------------------------------------------------------------------------------
    def view(self, buffer: memoryview, code: str, shape: Tuple[int, ...]) -> Any:
        """A CPU tensor over ``buffer`` without copying (it keeps the buffer alive)."""
        raise NotImplementedError

    def from_dlpack(self, capsule: Any) -> Any:
        """A CPU tensor over a DLPack capsule (dlpack adapters)."""
        raise NotImplementedError

    def reinterpret(self, tensor: Any, code: str, shape: Tuple[int, ...]) -> Any:
        """A tensor exported as its bytes (``bytes_dtype``, 1-d) as the tensor of ``code`` and ``shape``."""
        raise NotImplementedError

    def empty(self, code: str, shape: Tuple[int, ...]) -> Tuple[Any, int]:
        """A new CPU tensor to read into, and the address of its first byte."""
        raise NotImplementedError

    def meta(self, code: str, shape: Tuple[int, ...], device: Any) -> Any:
        raise NotImplementedError

    def finish(self, tensor: Any, code: str, shape: Tuple[int, ...]) -> Any:
        """Turns a destination filled by a read (see ``empty``) into the tensor of ``shape``."""
        return tensor

    def to_device(self, tensor: Any, device: Any) -> Any:
        return tensor

    def stage(self, file: "_cpp.File", infos: List[Tuple[str, Tuple[str, Tuple[int, ...], int, int]]],
              device: Any) -> Dict[str, Any]:
        """Every tensor of ``infos`` allocated on ``device`` and filled there (where ``stages(device)``)."""
        raise NotImplementedError

    def reshape(self, tensor: Any, shape: Tuple[int, ...]) -> Any:
        return tensor.reshape(shape)

    def stack(self, tensors: List[Any], axis: int) -> Any:
        raise NotImplementedError

    def reference_slice_error(self, reader: "_Reader", index: Any, code: str, shape: Tuple[int, ...]) -> Optional[str]:
        """The reference's text for an index our slicer refused (None where the reference accepts it)."""
        from ._slice_errors import rust_indexer_error

        return rust_indexer_error(index, shape)

    def load_copies(self, file: "_cpp.File", device: Any = "cpu") -> Dict[str, Any]:
        """Every tensor of ``file`` copied into memory of its own, on ``device`` (for ``load(bytes)``)."""
        with gc_paused():
            return _strategies.load_copies(self, file, self.resolve_device(device))


class safe_open(_cpp.SafeOpenBase):
    """Opens a safetensors file lazily and returns tensors as asked.

    ``get_slice(name)`` (a lazy handle on tensor ``name`` that reads only what an index expression selects) is
    the native base class's method: one C call per name.

    Args:
        filename: the file to open.
        framework: ``pt``/``torch``/``pytorch``, ``np``/``numpy``, ``tf``/``tensorflow``, ``flax``/``jax``,
            ``mlx`` or ``paddle``.
        device: where tensors are delivered (``"cpu"``, ``"cuda:0"``, ``"npu:1"``, an int, a ``torch.device``,
            ``"meta"``...). Non-CPU devices need ``pt`` (or ``paddle``).
        backend: ``"mmap"`` (CPU tensors are zero-copy, copy-on-write views of the file; loads onto another
            device, which cannot be views, read as ``"auto"``), ``"pread"`` (tensors own their memory, read
            with positional reads through the page cache), ``"direct"`` (read with O_DIRECT, past the page
            cache; through it where the filesystem refuses) or ``"auto"`` (per file: ``"direct"`` for a file of
            64 MiB or more that the page cache holds less than a third of, else ``"pread"``). A remote file is
            always read.
        storage_options: for an ``s3://``, ``https://`` or ``http://`` ``filename``: credentials, endpoint,
            headers and transfer settings (README, "Remote checkpoints"); the AWS environment variables and
            files apply without them.
    """

    _open: Callable[[], "_Reader"]  # SafeOpenBase's: the _Reader, or SafetensorError "File is closed"

    def __init__(
        self,
        filename: PathLike,
        framework: str,
        device: Any = "cpu",
        *,
        backend: str = "mmap",
        storage_options: Optional[StorageOptions] = None,
    ) -> None:
        adapter = framework_adapter(framework)
        resolved = adapter.resolve_device(device)
        opened = reading_backend(backend, not adapter.is_cpu(resolved) and not adapter.is_meta(resolved))
        # The native open also refuses a backend it does not know, and a bad storage option.
        file = _cpp.File(_fspath(filename), opened, remote=remote_pairs(storage_options))
        log_source(file, opened)
        # What get_slice serves and _open() returns until __exit__: SafeOpenBase (in C) keeps the one record
        # of whether this handle is open, and the one "File is closed" error.
        self._attach(file, _Reader(file, adapter, resolved, opened, backend))

    def __enter__(self) -> "safe_open":
        return self

    def __exit__(self, exc_type: Any, exc_value: Any, traceback: Any) -> None:
        self._detach()

    def keys(self) -> List[str]:
        """Tensor names, sorted."""
        return self._open().keys()

    def offset_keys(self) -> List[str]:
        """Tensor names in the order of their data in the file."""
        return self._open().file.offset_keys()

    def metadata(self) -> Optional[Dict[str, str]]:
        """The ``__metadata__`` map, or None."""
        return self._open().file.metadata()

    def get_tensor(self, name: str) -> Any:
        """The whole tensor ``name``, in the framework and on the device this file was opened for."""
        reader = self._open()
        return reader.one(reader, name)  # the strategy's (_strategies.py), inlined: the per-tensor path

    def get_tensors(self) -> Dict[str, Any]:
        """Every tensor, keyed by name, in file order."""
        reader = self._open()
        with gc_paused():
            return _strategies.get_tensors(reader)

    def get_tensor_meta(self, name: str) -> "TensorMeta":
        """Tensor ``name``'s header entry (dtype code, shape, data offsets); no data is read."""
        code, shape, begin, end = self._open().file.info(name)
        return TensorMeta(code, list(shape), (begin, end))

    def prefetch(self, plan: Optional[Dict[str, Optional[slice]]] = None, *, device: Any = None,
                 threads: int = _cpp.DEFAULT_READER_THREADS) -> "PrefetchLoader":
        """Starts loading tensors in the background and returns at once.

        Args:
            plan: ``None`` loads every tensor whole; else ``{name: None | slice}``, a slice taking rows
                ``[start, stop)`` of the first dimension (step 1; negative bounds count from the end).
            device: where the tensors go (defaults to the handle's device): ``"cpu"``, ``"cuda:0"``,
                ``"npu:1"``, an int (a device of the current accelerator), a ``torch.device``...
            threads: reader threads of this loader (CPU loads).

        Every error of the plan is raised here, before anything is read. Only ``framework="pt"``.
        """
        reader = self._open()
        if reader.adapter.name != "pytorch":
            raise SafetensorError('prefetch is only compatible with framework="pt"')
        from ._prefetch import plan_pieces

        target = reader.device if device is None else reader.adapter.resolve_device(device)
        if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
            raise SafetensorError(f"prefetch threads must be a positive integer, got {threads!r}")
        pieces = plan_pieces(reader, plan)
        # A prefetch reads, never views: from a handle that maps the file it reads the same open file as "auto".
        file = reader.file
        if file.backend == "mmap":
            file = file.with_backend("auto")
            log_source(file, "auto")
        return PrefetchLoader(file, pieces, target, threads)


class TensorMeta:
    """A tensor's header entry, as written in the file: ``dtype`` (the code, e.g. ``"F32"``), ``shape`` and
    ``data_offsets`` (``(begin, end)`` within the data buffer). Built without reading any data."""

    __slots__ = ("_dtype", "_shape", "_offsets")

    def __init__(self, dtype: str, shape: List[int], data_offsets: Tuple[int, int]) -> None:
        self._dtype = dtype
        self._shape = shape
        self._offsets = data_offsets

    @property
    def dtype(self) -> str:
        return self._dtype

    @property
    def shape(self) -> List[int]:
        return list(self._shape)

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


# A tensor not read yet: get_shape(), get_dtype(), len() and [index] (numpy semantics); native, see
# python/src/module.cc. Its [index] is _Reader.slice_item.
PySafeSlice = _cpp.PySafeSlice


class _safe_open_handle(safe_open):
    """``safe_open`` over an open file object (opened by its ``name``), as the reference's class of this name."""

    def __init__(self, f: Any, framework: str, device: Any = "cpu", *, backend: str = "mmap") -> None:
        super().__init__(f.name, framework, device, backend=backend)


class TensorSpec:
    """One tensor for :func:`serialize` / :func:`serialize_file`: raw memory described by a torch-style dtype
    name and a shape. The caller keeps ``data_ptr`` valid until the call returns.

    For ``float4_e2m1fn_x2`` the storage shape (two values per byte) is accepted and the last dimension is
    doubled, so ``shape`` is always the logical element count written to the header.
    """

    __slots__ = ("_dtype", "_shape", "_data_ptr", "_data_len")

    def __init__(self, *, dtype: str, shape: Sequence[int], data_ptr: int, data_len: int) -> None:
        code = _CODE_BY_TORCH_NAME.get(dtype) if isinstance(dtype, str) else None
        if code is None:
            supported = ", ".join(r.torch_name for r in DTYPES.values() if r.torch_name)
            raise SafetensorError(f'Unknown dtype "{dtype}". Supported dtypes: {supported}')
        dims = [int(d) for d in shape]
        if dims:
            dims[-1] *= DTYPES[code].torch_pack  # a packed torch type (F4's x2) names storage, not values
        self._dtype = code
        self._shape = dims
        self._data_ptr = int(data_ptr)
        self._data_len = int(data_len)

    @property
    def dtype(self) -> str:
        """The format code written to the header, e.g. ``"F32"``."""
        return self._dtype

    @property
    def shape(self) -> List[int]:
        return list(self._shape)

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
    _cpp.serialize_file(_specs(tensor_dict), _fspath(filename), _metadata(metadata), fsync)


Flattened = Tuple[List[tuple], List[Any]]


def serialize_flat(flat: Flattened, metadata: Optional[Mapping[str, str]]) -> bytes:
    """The bytes of a file from ``(specs, keep_alive)`` as a framework's ``_flatten`` makes them: specs of
    ``(name, code, shape, data_ptr, data_len)``, and the objects that keep those pointers valid meanwhile."""
    specs, keep_alive = flat
    return _cpp.serialize(specs, _metadata(metadata))


def serialize_flat_file(flat: Flattened, filename: PathLike, metadata: Optional[Mapping[str, str]], fsync: bool) -> None:
    """Writes ``(specs, keep_alive)`` (see serialize_flat) to ``filename`` atomically."""
    specs, keep_alive = flat
    _cpp.serialize_file(specs, _fspath(filename), _metadata(metadata), fsync)


def load_file_as(
    framework: str,
    filename: PathLike,
    device: Any = "cpu",
    backend: str = "mmap",
    storage_options: Optional[StorageOptions] = None,
) -> Dict[str, Any]:
    """Every tensor of ``filename`` for ``framework``: the body of each module's ``load_file``."""
    with safe_open(filename, framework=framework, device=device, backend=backend, storage_options=storage_options) as f:
        return f.get_tensors()


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
