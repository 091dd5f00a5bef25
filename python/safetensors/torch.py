"""PyTorch: save and load ``Dict[str, torch.Tensor]``, models with tied weights, on every device torch knows."""

from __future__ import annotations

import ctypes
from collections import defaultdict
from typing import Any, Dict, Iterable, List, Optional, Set, Tuple, Union

import torch

from . import _framework
from ._core import PathLike, Piece, SafetensorError, StorageOptions, to_little_endian
# Names the reference's module also offers (other projects import them from here).
from ._core import TensorSpec, deserialize, serialize, serialize_file  # noqa: F401
from ._devices import resolve_torch_device
from ._safe_open import safe_open  # noqa: F401
from ._torch_types import CODES, TYPES, allocate, byte_jobs, empty, header_shape, torch_dtype, torch_shape
from ._torch_types import SIZE as _SIZE  # noqa: F401 - the reference's name
from ._torch_types import TYPES as _TYPES  # noqa: F401 - the reference's name

__all__ = ["save", "save_file", "load", "load_file", "save_model", "load_model"]

# The reference's names for the dtypes newer torch versions add (None where this torch lacks one).
_float8_e4m3fn = getattr(torch, "float8_e4m3fn", None)
_float8_e4m3fnuz = getattr(torch, "float8_e4m3fnuz", None)
_float8_e5m2 = getattr(torch, "float8_e5m2", None)
_float8_e5m2fnuz = getattr(torch, "float8_e5m2fnuz", None)
_float8_e8m0 = getattr(torch, "float8_e8m0fnu", None)
_float4_e2m1_x2 = getattr(torch, "float4_e2m1fn_x2", None)


try:  # the capsule reader behind torch.from_dlpack, without its per-call argument handling
    from torch._C import _from_dlpack
except ImportError:  # pragma: no cover - other torch versions
    from torch.utils.dlpack import from_dlpack as _from_dlpack


def _getdtype(dtype_str: str) -> torch.dtype:
    return TYPES[dtype_str]


# -- accelerators: the loading engine -----------------------------------------------------------------------

def set_staging_capacity(nbytes: int) -> None:
    """The most page-locked host memory accelerator loads stage through at once, for the whole process
    (default ``_safetensors_cpp.engine.DEFAULT_STAGING_BYTES``; also ``SAFETENSORS_STAGING_BYTES``). Returned to the system when no load runs."""
    from . import _engine

    _engine.set_staging_capacity(nbytes)


def _staged_load(file: Any, pieces: List[Tuple[str, Piece]], device: torch.device) -> Dict[str, torch.Tensor]:
    """Allocates every tensor on ``device`` and fills it through the engine (``_engine.py``): reader threads
    into page-locked slabs of the process-wide pool, non-blocking copies to the device."""
    from . import _engine

    tensors, runs = allocate(pieces, device)
    _engine.fill(file, byte_jobs(tensors, pieces, runs), device)
    return {name: tensor for (name, _), tensor in zip(pieces, tensors)}


def _stages(device: torch.device) -> bool:
    """True for accelerators whose torch module has streams and events (cuda, npu, xpu, PrivateUse1 ...): the
    engine's staged path. Others get a CPU read and ``.to(device)``."""
    if device.type in ("cpu", "meta"):
        return False
    try:
        module = torch.get_device_module(device.type)
    except (RuntimeError, AttributeError):
        return False
    return hasattr(module, "Event") and hasattr(module, "current_stream")


# -- the framework adapter ----------------------------------------------------------------------------------

class _Torch(_framework.Framework):
    name = "pytorch"
    dlpack = True
    bytes_dtype = torch.uint8
    from_dlpack = staticmethod(_from_dlpack)
    stages_rows = True

    def resolve_device(self, device: Any) -> torch.device:
        return resolve_torch_device(device)

    def is_cpu(self, device: torch.device) -> bool:
        return device.type == "cpu"

    def is_meta(self, device: torch.device) -> bool:
        return device.type == "meta"

    def view(self, buffer: memoryview, code: str, shape: Tuple[int, ...]) -> torch.Tensor:
        dtype, tshape = torch_dtype(code), torch_shape(code, shape)
        if not len(buffer):
            return torch.empty(tshape, dtype=dtype, device="cpu")
        return torch.frombuffer(buffer, dtype=dtype).view(tshape)

    def empty(self, code: str, shape: Tuple[int, ...]) -> Tuple[torch.Tensor, int]:
        # An explicit device: loading ignores torch's default-device context.
        tensor = empty(code, shape, "cpu")
        return tensor, tensor.data_ptr()

    def reinterpret(self, tensor: torch.Tensor, code: str, shape: Tuple[int, ...]) -> torch.Tensor:
        dtype, tshape = torch_dtype(code), torch_shape(code, shape)
        return tensor.view(dtype).view(tshape)

    def stages(self, device: torch.device) -> bool:
        return _stages(device)

    def stage(self, file: Any, pieces: List[Tuple[str, Piece]], device: torch.device) -> Dict[str, torch.Tensor]:
        return _staged_load(file, pieces, device)

    def meta(self, code: str, shape: Tuple[int, ...], device: torch.device) -> torch.Tensor:
        return empty(code, shape, device)

    def to_device(self, tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
        return tensor if device.type == "cpu" else tensor.to(device)

    def stack(self, tensors: List[torch.Tensor], axis: int) -> torch.Tensor:
        return torch.stack(tensors, axis)

    def selects(self, code: str, shape: Tuple[int, ...]) -> bool:
        return torch_shape(code, shape) == tuple(shape)  # not packed (F4): the storage shape is the header's

    def select(self, rows: torch.Tensor, index: tuple) -> torch.Tensor:
        tensor = rows[index]
        # Memory of its own, as a CPU read gives: not a view holding all the rows.
        if tensor.numel() == rows.numel() and tensor.is_contiguous():
            return tensor
        return tensor.clone(memory_format=torch.contiguous_format)

    def reference_slice_error(self, reader: Any, index: Any, code: str, shape: Tuple[int, ...]) -> Optional[str]:
        # The reference indexes a torch tensor on the mmap backend (torch's errors) and uses its own indexer
        # on the pread backend: what the caller asked for decides (a device load reads an "mmap" file as "auto").
        if reader.asked == "mmap":
            from ._slice_errors import torch_indexing_error

            return torch_indexing_error(index, torch_shape(code, shape))
        return super().reference_slice_error(reader, index, code, shape)


#: How ``safe_open(framework="pt")`` builds tensors.
FRAMEWORK = _Torch()


# -- storage helpers other projects import ------------------------------------------------------------------

def storage_ptr(tensor: torch.Tensor) -> int:
    """Address of the start of the tensor's storage (0 when it has none)."""
    try:
        return tensor.untyped_storage().data_ptr()
    except Exception:
        try:
            return tensor.storage().data_ptr()  # very old torch / some subclasses
        except NotImplementedError:
            return 0


def storage_size(tensor: torch.Tensor) -> int:
    """Size in bytes of the tensor's storage."""
    try:
        return tensor.untyped_storage().nbytes()
    except Exception:
        try:
            return tensor.storage().size() * tensor.element_size()
        except NotImplementedError:
            return tensor.nelement() * tensor.element_size()


def _end_ptr(tensor: torch.Tensor) -> int:
    """One past the last byte the tensor's elements occupy."""
    if tensor.nelement() == 0:
        return tensor.data_ptr()
    span = 1 + sum((size - 1) * stride for size, stride in zip(tensor.shape, tensor.stride()))
    return tensor.data_ptr() + span * tensor.element_size()


def _is_complete(tensor: torch.Tensor) -> bool:
    """True when the tensor covers its whole storage."""
    return tensor.data_ptr() == storage_ptr(tensor) and tensor.nelement() * tensor.element_size() == storage_size(tensor)


def _filter_shared_not_shared(tensors: List[Set[str]], state_dict: Dict[str, torch.Tensor]) -> List[Set[str]]:
    """Splits each group of names on one storage into groups of overlapping byte ranges, transitively: ranges
    sorted by (start, end, name), a range starting before the furthest end seen in the current group joins it
    (a range nested in a longer one does not end the group early). The reference's releases compare with the
    previous range's own end only; its main branch fixed that, and this follows the fix."""
    out: List[Set[str]] = []
    for shared in tensors:
        if len(shared) < 2:
            out.append(shared)
            continue
        spans = sorted((state_dict[n].data_ptr(), _end_ptr(state_dict[n]), n) for n in shared)
        group_end = None
        for start, end, name in spans:
            if group_end is not None and start < group_end:
                out[-1].add(name)
                group_end = max(group_end, end)
            else:
                out.append({name})
                group_end = end
    return out


def _find_shared_tensors(state_dict: Dict[str, torch.Tensor]) -> List[Set[str]]:
    """Groups of names whose tensors overlap in memory, singletons included, grouped by (device, storage)
    in first-seen order. Tensors with no memory (meta, a null or empty storage) are left out entirely."""
    by_storage: Dict[Any, Set[str]] = defaultdict(set)
    for name, tensor in state_dict.items():
        if tensor.device.type != "meta" and storage_ptr(tensor) != 0 and storage_size(tensor) != 0:
            by_storage[(tensor.device, storage_ptr(tensor), storage_size(tensor))].add(name)
    # sorted() as the reference sorts: sets compare by inclusion, and these are disjoint, so the order stays.
    return _filter_shared_not_shared(sorted(by_storage.values()), state_dict)


def _remove_duplicate_names(
    state_dict: Dict[str, torch.Tensor],
    *,
    preferred_names: Optional[Iterable[str]] = None,
    discard_names: Optional[Iterable[str]] = None,
) -> Dict[str, List[str]]:
    """For each group of shared tensors, the name to keep (one covering the whole storage, preferring
    ``preferred_names``, avoiding ``discard_names``) mapped to the names to drop."""
    preferred = set(preferred_names or [])
    discard = set(discard_names or [])
    to_remove: Dict[str, List[str]] = defaultdict(list)
    for shared in _find_shared_tensors(state_dict):
        if len(shared) == 1:
            # Nothing to drop. A lone view of a larger storage is saved as its own bytes: parameters packed
            # into one buffer as disjoint views (an RNN after flatten_parameters, cuDNN). The reference's
            # releases refuse it; its main branch accepts it, as here.
            continue
        complete = {name for name in shared if _is_complete(state_dict[name])}
        if not complete:
            raise RuntimeError(
                "Error while trying to find names to remove to save state dict, but found no suitable name to keep "
                f"for saving amongst: {shared}. None is covering the entire storage.Refusing to save/load the model "
                "since you could be storing much more memory than needed. Please refer to "
                "https://huggingface.co/docs/safetensors/torch_shared_tensors for more information. Or open an issue."
            )
        keep = sorted(complete)[0]
        not_discarded = complete - discard
        if not_discarded:
            keep = sorted(not_discarded)[0]
        wanted = complete & preferred
        if wanted:
            keep = sorted(wanted)[0]
        for name in sorted(shared):
            if name != keep:
                to_remove[keep].append(name)
    return to_remove


def _tobytes(tensor: torch.Tensor, name: str) -> bytes:
    """The tensor's bytes, little-endian, as written to a file."""
    if tensor.layout != torch.strided:
        raise ValueError(f"You are trying to save a sparse tensor: `{name}` which this library does not support.")
    if not tensor.is_contiguous():
        raise ValueError(_framework.non_contiguous_message(name))
    tensor = tensor.cpu()
    nbytes = tensor.nelement() * _SIZE[tensor.dtype]
    if nbytes == 0:
        return b""
    return to_little_endian(ctypes.string_at(tensor.data_ptr(), nbytes), CODES[tensor.dtype])


def _to_ndarray(tensor: torch.Tensor) -> Tuple[Any, Any]:
    """``(array, tensor)``: a numpy uint8 array over the tensor's bytes without a copy (nelement x element
    size bytes from ``data_ptr``), and the CPU tensor owning them, which the caller keeps alive while the array
    is used (the array holds no reference). Tensors on other devices are copied to the CPU first. A tensor
    without memory gives ``(np.empty(0), 0)``."""
    import numpy as np

    from ._numpy_bridge import little_endian_bytes

    if tensor.device.type != "cpu":
        tensor = tensor.to("cpu")
    ptr = tensor.data_ptr()
    if ptr == 0:
        return np.empty(0), 0
    return little_endian_bytes(ptr, tensor.nelement() * _SIZE[tensor.dtype], CODES[tensor.dtype]), tensor


# -- saving ------------------------------------------------------------------------------------------------

def _evaluate_tensors_for_save(tensors: Dict[str, torch.Tensor]) -> None:
    """The checks before saving, in the reference's order: a dict, of tensors, dense, sharing no memory (the
    contiguity check follows in _flatten, which old torch versions cannot run on sparse tensors)."""
    if not isinstance(tensors, dict):
        raise ValueError(f"Expected a dict of [str, torch.Tensor] but received {type(tensors)}")
    for name, value in tensors.items():
        if not isinstance(value, torch.Tensor):
            raise ValueError(f"Key `{name}` is invalid, expected torch.Tensor but received {type(value)}")
    sparse = [name for name, value in tensors.items() if value.layout != torch.strided]
    if sparse:
        raise ValueError(
            f"You are trying to save a sparse tensors: `{sparse}` which this library does not support. You can make "
            "it a dense tensor before saving with `.to_dense()` but be aware this might make a much larger file than "
            "needed."
        )
    shared = [names for names in _find_shared_tensors(tensors) if len(names) > 1]
    if shared:
        raise RuntimeError(
            f"""
            Some tensors share memory, this will lead to duplicate memory on disk and potential differences when loading them again: {shared}.
            A potential way to correctly save your model is to use `save_model`.
            More information at https://huggingface.co/docs/safetensors/torch_shared_tensors
            """
        )


def _flatten(tensors: Dict[str, torch.Tensor]) -> Tuple[List[tuple], List[torch.Tensor]]:
    """Checks tensors for saving (in the reference's order) and describes each by address; the second list
    keeps CPU copies of device tensors alive until the write is done."""
    _evaluate_tensors_for_save(tensors)
    for name, value in tensors.items():
        if not value.is_contiguous():
            raise ValueError(_framework.non_contiguous_message(name))
    specs = []
    keep_alive = []
    for name, value in tensors.items():
        code = CODES.get(value.dtype)
        if code is None:
            raise SafetensorError(f"tensor `{name}` has dtype {value.dtype}, which safetensors cannot store")
        shape = header_shape(name, code, value)
        if value.device.type != "cpu":
            value = value.to("cpu")  # meta tensors fail here, as in the reference
        keep_alive.append(value)
        nbytes = value.nelement() * _SIZE[value.dtype]
        specs.append((name, code, shape, value.data_ptr() if nbytes else 0, nbytes))
    return specs, keep_alive


def _flatten_as_ptr(tensors: Dict[str, torch.Tensor], keep_alive_buffer: List) -> Dict[str, TensorSpec]:
    """The reference's form of _flatten: ``{name: TensorSpec}`` for serialize/serialize_file, after the same
    checks; what keeps the described memory valid is appended to ``keep_alive_buffer``."""
    specs, keep_alive = _flatten(tensors)
    keep_alive_buffer.extend(keep_alive)
    return {
        name: TensorSpec(dtype=str(tensor.dtype).split(".")[-1], shape=tensor.shape, data_ptr=ptr, data_len=nbytes)
        for (name, _, _, ptr, nbytes), tensor in zip(specs, keep_alive)
    }


# -- loading -----------------------------------------------------------------------------------------------

def _view2torch(safeview: List[Tuple[str, Dict[str, Any]]]) -> Dict[str, torch.Tensor]:
    """``deserialize`` output to ``{name: CPU tensor}``; each tensor shares the memory of its ``data``."""
    return {name: FRAMEWORK.view(v["data"], v["dtype"], tuple(v["shape"])) for name, v in safeview}


def save(tensors: Dict[str, torch.Tensor], metadata: Optional[Dict[str, str]] = None) -> bytes:
    """The bytes of a safetensors file holding ``tensors`` (a dict of ``torch.Tensor`` by name)."""
    return _framework.save(_flatten, tensors, metadata)


def save_file(tensors: Dict[str, torch.Tensor], filename: PathLike, metadata: Optional[Dict[str, str]] = None, *,
              fsync: bool = False) -> None:
    """Writes ``tensors`` (a dict of ``torch.Tensor`` by name) to ``filename`` atomically: a temporary file in
    the same directory, renamed over it. ``fsync=True`` also makes the new file durable before returning."""
    _framework.save_file(_flatten, tensors, filename, metadata, fsync)


def load(data: bytes) -> Dict[str, torch.Tensor]:
    """Every tensor of the file in ``data``, in memory of its own."""
    return _framework.load(FRAMEWORK, data, "cpu")


def load_file(filename: PathLike, device: Any = "cpu", *, backend: str = "mmap",
              storage_options: Optional[StorageOptions] = None) -> Dict[str, torch.Tensor]:
    """Every tensor of ``filename`` on ``device``, in file order. ``backend``: ``"mmap"``, ``"pread"``, ``"direct"`` or ``"auto"`` (as for ``safe_open``).
    ``filename`` may be an ``s3://``, ``https://`` or ``http://`` URL; ``storage_options`` as for ``safe_open``."""
    return _framework.load_file("pt", filename, device, backend, storage_options)


# -- models ------------------------------------------------------------------------------------------------

def save_model(
    model: torch.nn.Module, filename: PathLike, metadata: Optional[Dict[str, str]] = None, force_contiguous: bool = True
) -> None:
    """Saves ``model.state_dict()``, dropping aliases of tied weights and recording ``{dropped: kept}`` in the
    metadata so :func:`load_model` restores them."""
    state_dict = model.state_dict()
    metadata = dict(metadata) if metadata is not None else None
    for kept, dropped in _remove_duplicate_names(state_dict).items():
        for name in dropped:
            if metadata is None:
                metadata = {}
            metadata.setdefault(name, kept)
            del state_dict[name]
    if force_contiguous:
        state_dict = {name: value.contiguous() for name, value in state_dict.items()}
    try:
        save_file(state_dict, filename, metadata=metadata)
    except ValueError as e:
        raise ValueError(
            f"{e} Or use save_model(..., force_contiguous=True), read the docs for potential caveats."
        ) from None


def load_model(
    model: torch.nn.Module,
    filename: PathLike,
    strict: bool = True,
    device: Union[str, int, torch.device] = "cpu",
    *,
    backend: str = "mmap",
    storage_options: Optional[StorageOptions] = None,
) -> Tuple[Set[str], List[str]]:
    """Loads ``filename`` (a path or an ``s3://``/``https://`` URL, see ``storage_options`` in ``safe_open``)
    into ``model`` (tied weights included). Returns ``(missing, unexpected)``; with ``strict`` either being
    non-empty raises RuntimeError the way ``load_state_dict`` does."""
    state_dict = load_file(filename, device=device, backend=backend, storage_options=storage_options)
    tied = _remove_duplicate_names(model.state_dict(), preferred_names=state_dict.keys())
    missing_list, unexpected = model.load_state_dict(state_dict, strict=False)
    missing = set(missing_list)
    for dropped in tied.values():
        for name in dropped:
            if name in missing:
                missing.remove(name)
            else:
                unexpected.append(name)
    if strict and (missing or unexpected):
        error = f"Error(s) in loading state_dict for {model.__class__.__name__}:"
        if missing:
            error += "\n    Missing key(s) in state_dict: " + ", ".join(f'"{k}"' for k in sorted(missing))
        if unexpected:
            error += "\n    Unexpected key(s) in state_dict: " + ", ".join(f'"{k}"' for k in sorted(unexpected))
        raise RuntimeError(error)
    return missing, unexpected
