"""``safe_open``: a file opened for one framework and device, handing out tensors, slices and prefetches.

Which framework module builds the tensors is looked up by name (``FRAMEWORK_MODULES``) and imported on first
use, so opening a numpy file never imports torch; each framework module supplies its ``FRAMEWORK`` (an
``_framework.Framework``). How a load runs is ``_strategies.py``'s table; prefetches are ``_prefetch.py``'s.
"""

from __future__ import annotations

import importlib
import logging
import operator
from typing import Any, Callable, Dict, List, Optional

from . import _safetensors_cpp as _cpp
from ._core import PathLike, SafetensorError, StorageOptions, TensorMeta, fspath, gc_paused, remote_pairs
from ._plan import PlanValue, plan_pieces
from ._prefetch import PrefetchLoader
from ._strategies import Reader, get_tensors

__all__ = ["FRAMEWORK_MODULES", "PySafeSlice", "framework_adapter", "safe_open"]

#: The ``framework`` names safe_open takes, and the module of this package that serves each.
FRAMEWORK_MODULES = {
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


def framework_adapter(framework: str) -> Any:
    """The ``Framework`` of a framework name (``pt``, ``np``, ...): its module's ``FRAMEWORK``, the module
    imported by name here (the one place the package reaches up to a framework module). SafetensorError for
    an unknown name."""
    module = FRAMEWORK_MODULES.get(framework) if isinstance(framework, str) else None
    if module is None:
        raise SafetensorError(f"framework {framework} is invalid")
    return importlib.import_module(f"safetensors.{module}").FRAMEWORK


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

    _open: Callable[[], Reader]  # SafeOpenBase's: the Reader, or SafetensorError "File is closed"

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
        file = _cpp.File(fspath(filename), opened, remote=remote_pairs(storage_options))
        log_source(file, opened)
        # What get_slice serves and _open() returns until __exit__: SafeOpenBase (in C) keeps the one record
        # of whether this handle is open, and the one "File is closed" error.
        self._attach(file, Reader(file, adapter, resolved, opened, backend))

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
            return get_tensors(reader)

    def get_tensor_meta(self, name: str) -> "TensorMeta":
        """Tensor ``name``'s header entry (dtype code, shape, data offsets); no data is read."""
        code, shape, begin, end = self._open().file.info(name)
        return TensorMeta(code, list(shape), (begin, end))

    def prefetch(self, plan: Optional[Dict[str, PlanValue]] = None, *, device: Any = None,
                 threads: int = _cpp.engine.DEFAULT_READER_THREADS) -> "PrefetchLoader":
        """Starts loading tensors in the background and returns at once.

        Args:
            plan: ``None`` loads every tensor whole; else ``{name: None | slice | tuple of slices}``: a slice
                takes rows ``[start, stop)`` of the first dimension, a tuple one slice per leading dimension
                (``(slice(None), slice(128, 256))``: a shard of the second dimension, read as strided runs);
                step 1, negative bounds count from the end, never clamped.
            device: where the tensors go (defaults to the handle's device): ``"cpu"``, ``"cuda:0"``,
                ``"npu:1"``, an int (a device of the current accelerator), a ``torch.device``...
            threads: reader threads of this loader (CPU loads): any positive integer; at most 64 run (the
                engine's maximum, ``_safetensors_cpp.engine.PREFETCH_MAX_THREADS``), fewer where the plan has
                fewer chunks.

        Every error of the plan is raised here, before anything is read. Only ``framework="pt"``.
        """
        # Checked first, as the reference's argument parsing does, and in its words: Python's TypeError for a
        # non-integer, PyO3's OverflowError for a negative one.
        threads = operator.index(threads)
        if threads < 0:
            raise OverflowError("can't convert negative int to unsigned")
        if threads == 0:
            raise SafetensorError("prefetch threads must be a positive integer, got 0")
        reader = self._open()
        if reader.adapter.name != "pytorch":
            raise SafetensorError('prefetch is only compatible with framework="pt"')
        target = reader.device if device is None else reader.adapter.resolve_device(device)
        pieces = plan_pieces(reader.file, plan)
        # A prefetch reads, never views: from a handle that maps the file it reads the same open file as "auto".
        file = reader.file
        if file.backend == "mmap":
            file = file.with_backend("auto")
            log_source(file, "auto")
        return PrefetchLoader(file, pieces, target, min(threads, _cpp.engine.PREFETCH_MAX_THREADS))


# A tensor not read yet: get_shape(), get_dtype(), len() and [index] (numpy semantics); native, see
# python/src/py_slice.cc. Its [index] is _strategies.Reader.slice_item.
PySafeSlice = _cpp.PySafeSlice
