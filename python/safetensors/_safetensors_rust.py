"""The reference's native module by name: code that imports ``safetensors._safetensors_rust`` (for
``SafetensorError``, ``safe_open``, ...) gets the same objects as ``safetensors.X``; nothing is implemented here."""

from . import __version__  # noqa: F401
from . import _core
from ._core import (  # noqa: F401
    SafetensorError,
    TensorSpec,
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
]

# The 0.9.0rc1 names, from _core as it provides them.
for _name in ("TensorMeta", "PySafeSlice", "PrefetchLoader", "TensorStream"):
    if hasattr(_core, _name):
        globals()[_name] = getattr(_core, _name)
        __all__.append(_name)
del _name, _core
