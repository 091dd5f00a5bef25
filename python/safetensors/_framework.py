"""What a framework module (``safetensors/numpy.py``, ``torch.py``, ...) is made of: the ``Framework`` base its
adapter subclasses -- how the framework builds and unpacks tensors -- and the one implementation of the four
functions every framework module writes out with the reference's parameter names: ``save``, ``save_file``,
``load`` and ``load_file``, each a ``def`` of a few lines in its module that calls the function of the same
name here.

A new framework is a module ``safetensors/<name>.py`` with a ``Framework`` subclass as its ``FRAMEWORK`` (a
framework whose tensors are built from numpy arrays subclasses ``_numpy_bridge.NumpyBridged`` instead), its
names in ``_safe_open.FRAMEWORK_MODULES``, and those four ``def``s.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

from . import _safetensors_cpp as _cpp
from ._core import (
    Flattened,
    PathLike,
    Piece,
    SafetensorError,
    StorageOptions,
    gc_paused,
    open_bytes,
    serialize_flat,
    serialize_flat_file,
)
from ._safe_open import safe_open
from ._strategies import load_copies

__all__ = ["Framework", "from_numpy_in_place", "load", "load_file", "non_contiguous_message", "save", "save_file"]


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

    def stage(self, file: "_cpp.File", pieces: List[Tuple[str, Piece]], device: Any) -> Dict[str, Any]:
        """Every tensor of ``pieces`` (whole tensors or rows of one: one byte range each) allocated on ``device``
        and filled there (where ``stages(device)``); a framework may leave some out, which are then read on the
        CPU and moved."""
        raise NotImplementedError

    def reshape(self, tensor: Any, shape: Tuple[int, ...]) -> Any:
        return tensor.reshape(shape)

    def as_strided(self, tensor: Any, shape: Tuple[int, ...], strides: Tuple[int, ...], first: int) -> Any:
        """A view of ``tensor`` (a whole tensor, C-contiguous, of whole-byte elements) with ``shape`` and
        ``strides`` (in elements, none negative) starting at its element number ``first``: the same storage.
        For DLPack adapters (their slices of mapped files are such views); this default is torch's."""
        return tensor.as_strided(shape, strides, tensor.storage_offset() + first)

    def stack(self, tensors: List[Any], axis: int) -> Any:
        raise NotImplementedError

    def reference_slice_error(self, reader: Any, index: Any, code: str, shape: Tuple[int, ...]) -> Optional[str]:
        """The reference's text for an index our slicer refused (None where the reference accepts it)."""
        from ._slice_errors import rust_indexer_error

        return rust_indexer_error(index, shape)

    def load_copies(self, file: "_cpp.File", device: Any = "cpu") -> Dict[str, Any]:
        """Every tensor of ``file`` copied into memory of its own, on ``device`` (for ``load(bytes)``)."""
        with gc_paused():
            return load_copies(self, file, self.resolve_device(device))


def non_contiguous_message(name: str) -> str:
    """The reference's ValueError text for saving a tensor that is not contiguous."""
    return (
        f"You are trying to save a non contiguous tensor: `{name}` which is not allowed. It either means you are "
        "trying to save tensors which are reference of each other in which case it's recommended to save only the "
        "full tensors, and reslice at load time, or simply call `.contiguous()` on your tensor to pack it before "
        "saving."
    )


# -- the four functions ---------------------------------------------------------------------------------------
# ``flatten`` is the module's check-and-describe step for saving: a dict of its tensors -> ``(specs, keep_alive)``
# (see _core.serialize_flat); its errors are the save errors.

def save(flatten: Callable[[Any], Flattened], tensors: Any, metadata: Optional[Mapping[str, str]]) -> bytes:
    """The bytes of a safetensors file holding ``tensors``."""
    return serialize_flat(flatten(tensors), metadata)


def save_file(flatten: Callable[[Any], Flattened], tensors: Any, filename: PathLike,
              metadata: Optional[Mapping[str, str]], fsync: bool) -> None:
    """Writes ``tensors`` to ``filename`` atomically: a temporary file in the same directory, renamed over it,
    each tensor streamed from its own memory; ``fsync`` also makes the new file durable before returning."""
    serialize_flat_file(flatten(tensors), filename, metadata, fsync)


def load(framework: Framework, data: Any, device: Any) -> Dict[str, Any]:
    """Every tensor of the file in ``data`` (a bytes-like object), on ``device``, in memory of its own."""
    return framework.load_copies(open_bytes(data), device)


def load_file(framework: str, filename: PathLike, device: Any, backend: str,
              storage_options: Optional[StorageOptions]) -> Dict[str, Any]:
    """Every tensor of ``filename`` (a path or a URL) for ``framework`` (a ``safe_open`` name), on ``device``, in
    file order."""
    with safe_open(filename, framework=framework, device=device, backend=backend,
                   storage_options=storage_options) as f:
        return f.get_tensors()


def from_numpy_in_place(framework: Framework, numpy_dict: Dict[str, Any]) -> Dict[str, Any]:
    """The reference's ``_np2<framework>(numpy_dict)``: replaces each array of the dict by ``framework``'s CPU
    tensor of it, in place, and returns the dict."""
    for key, value in numpy_dict.items():
        numpy_dict[key] = framework.to_device(value, "cpu")
    return numpy_dict
