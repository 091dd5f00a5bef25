"""The reference's native module by name: code that imports ``safetensors._safetensors_rust`` (for
``SafetensorError``, ``safe_open``, ...) gets the same objects as ``safetensors.X``; nothing is implemented here."""

from . import (  # noqa: F401
    PrefetchLoader,
    PySafeSlice,
    SafetensorError,
    TensorMeta,
    TensorSpec,
    TensorStream,
    __version__,
    _safe_open_handle,
    deserialize,
    safe_open,
    serialize,
    serialize_file,
)

__all__ = [
    "serialize",
    "serialize_file",
    "deserialize",
    "TensorSpec",
    "safe_open",
    "_safe_open_handle",
    "SafetensorError",
    "__version__",
    "TensorMeta",
    "PySafeSlice",
    "PrefetchLoader",
    "TensorStream",
]
