"""The one table of loading strategies: how the tensors of an open file become a framework's tensors.

A reader (an open file, a framework adapter and a device) gets one strategy when it is made, and every load
through it -- ``safe_open.get_tensor``, ``get_tensors``, ``get_slice``, ``load_file``, ``load(bytes)`` -- runs
that strategy's row of ``_TABLE``:

========  ================================================  ==================================================
strategy  chosen when                                       how tensors are made
========  ================================================  ==================================================
meta      the device is ``meta``                            ``adapter.meta``: no data is read
view      mmap backend, a CPU device, the file is mapped    zero-copy exports of the mapping (File.view /
                                                            File.buffer); tensors keep the mapping alive
owned     every other load onto the CPU, and devices that   File.read into new memory (File.read_all for many:
          do not stage                                      parallel, GIL released), then ``to_device``
staged    the adapter stages loads onto the device          ``adapter.stage``: the C++ loading engine
          (``adapter.stages(device)``: torch's accelerators  (``_engine.py``), page-locked slabs to the device;
          with streams and events, paddle's devices)        tensors it leaves out are read as owned, then moved
========  ================================================  ==================================================

Slices read only the bytes they select (File.read_slice into ``adapter.empty``) under every strategy but
meta; under the view one, DLPack adapters (torch) get a strided view of the tensor's view instead wherever a
view can show the selection (``adapter.as_strided``: integers, slices with positive steps, ``...``, ``None``;
not a negative step, an integer list, elements that are not whole bytes, nor a tensor ``File.view`` does not
give: a read-only mapping, bytes this host swaps); under the staged one, adapters with ``stages_rows`` stream
whole rows of the first dimension through the engine.

An adapter (``_framework.Framework``) supplies only construction primitives, and declares which kind of export it
builds from: ``dlpack = True`` -- ``from_dlpack(capsule)``, and ``reinterpret(tensor, code, shape)`` for the
dtypes DLPack has no code for, which arrive as their bytes (``bytes_dtype``); ``dlpack = False`` --
``view(memoryview, code, shape)``, a host array that ``to_device`` turns into the framework's tensor.
"""

from __future__ import annotations

import sysconfig
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Tuple

from . import _safetensors_cpp as _cpp
from ._core import DTYPES, HOST_SWAPS, Piece
from ._slicing import parse_index

META, VIEW, OWNED, STAGED = "meta", "view", "owned", "staged"

#: Codes a DLPack export cannot type: such tensors are exported as their bytes (1-d uint8).
_UNTYPED = frozenset(code for code, row in DTYPES.items() if row.dlpack_code is None)


def choose(adapter: Any, file: "_cpp.File", device: Any, backend: Optional[str]) -> str:
    """The strategy for loading ``file`` onto ``device`` (``backend`` is what the caller asked for; None for a
    file in memory, whose tensors are always copies)."""
    if adapter.is_meta(device):
        return META
    if adapter.stages(device):
        return STAGED
    if backend == "mmap" and adapter.is_cpu(device) and file.backend == "mmap":
        return VIEW
    return OWNED


_FREE_THREADED = bool(sysconfig.get_config_var("Py_GIL_DISABLED"))


def buffer_of(reader: "Reader") -> memoryview:
    """The data buffer to view tensors in: the reader's one export, or on a free-threaded Python a new one."""
    return reader.mv if reader.mv is not None else reader.file.buffer()


class Reader:
    """What tensors and slice objects need from an open file: it outlives the safe_open that made it."""

    __slots__ = ("file", "adapter", "device", "asked", "strategy", "one", "all", "deliver", "retype", "mv", "_keys")

    def __init__(self, file: "_cpp.File", adapter: Any, device: Any, backend: Optional[str],
                 asked: Optional[str] = None) -> None:
        self.file = file
        self.adapter = adapter
        self.device = device
        # The backend the caller named (``backend`` is what the file was opened with: a device load opens
        # "mmap", the default, as "auto"); the reference's behaviour, its slice errors, follows this one.
        self.asked = backend if asked is None else asked
        self.strategy = choose(adapter, file, device, backend)
        self.one, self.all = _TABLE[self.strategy][adapter.dlpack]
        # What turns a built CPU tensor into the delivered one: nothing on the CPU unless the adapter wraps
        # host arrays (Framework.wraps), else to_device.
        self.deliver = None if adapter.is_cpu(device) and not adapter.wraps else adapter.to_device
        # Whether some tensor's dtype is exported as bytes (the file's distinct dtypes, from the header).
        self.retype = adapter.dlpack and not _UNTYPED.isdisjoint(file.dtypes())
        # The data buffer, exported once, for adapters that view it (the view strategy without DLPack).
        # Not on a free-threaded Python: there one memoryview sliced from several threads at once fails
        # ("operation forbidden on released memoryview object", CPython 3.14.7t, reproduced without this
        # package), so each call exports the buffer afresh (buffer_of).
        self.mv: Optional[memoryview] = (file.buffer() if self.strategy == VIEW and not adapter.dlpack
                                         and not _FREE_THREADED else None)
        self._keys: Optional[List[str]] = None

    def keys(self) -> List[str]:
        # Filled on first use, without a lock: threads that race here each store a complete, equal list (one
        # attribute store, atomic on a free-threaded Python too), and every caller gets a copy.
        if self._keys is None:
            self._keys = self.file.keys()
        return list(self._keys)  # callers may mutate what they get

    def slice_item(self, name: str, index: Any) -> Any:
        """``get_slice(name)[index]`` (PySafeSlice.__getitem__): numpy's indexing, the reference's refusals."""
        code, shape, _, _ = self.file.info(name)
        try:
            return get_slice(self, name, code, parse_index(index, len(shape)))
        except _cpp.SafetensorSliceError as e:
            # Refused: where the reference refuses the same index too, its exact words.
            text = self.adapter.reference_slice_error(self, index, code, shape)
            if text is None:
                raise
            raise _cpp.SafetensorSliceError(text) from e


# -- building from exports ------------------------------------------------------------------------------------

def _retyped(reader: Reader, name: str, tensor: Any) -> Any:
    """``tensor`` from a DLPack export, as the tensor of its header entry."""
    if tensor.dtype is reader.adapter.bytes_dtype:  # U8, or the bytes of a dtype DLPack cannot describe
        code, shape, _, _ = reader.file.info(name)
        if code in _UNTYPED:
            return reader.adapter.reinterpret(tensor, code, shape)
    return tensor


def _from_dlpack(reader: Reader, name: str, capsule: Any) -> Any:
    tensor = reader.adapter.from_dlpack(capsule)
    return _retyped(reader, name, tensor) if reader.retype else tensor


def _from_owned(reader: Reader, name: str, export: Any, code: Optional[str] = None,
                shape: Tuple[int, ...] = ()) -> Any:
    """A tensor from memory of its own (a File.read export), delivered to the reader's device; ``code`` and
    ``shape`` are the header entry's where the caller has them (adapters without DLPack need them)."""
    if reader.adapter.dlpack:
        tensor = _from_dlpack(reader, name, export)
    else:
        if code is None:
            code, shape, _, _ = reader.file.info(name)
        tensor = reader.adapter.view(export, code, shape)
    return tensor if reader.deliver is None else reader.deliver(tensor, reader.device)


# -- the strategies -------------------------------------------------------------------------------------------

def _meta_one(reader: Reader, name: str) -> Any:
    code, shape, _, _ = reader.file.info(name)
    return reader.adapter.meta(code, shape, reader.device)


def _meta_all(reader: Reader) -> Dict[str, Any]:
    return {name: reader.adapter.meta(code, shape, reader.device) for name, (code, shape, _, _) in reader.file.infos()}


def _view_one_dlpack(reader: Reader, name: str) -> Any:
    capsule = reader.file.view(name)
    if capsule is None:  # a read-only mapping: tensors must be writable, so they get memory of their own
        return _owned_one(reader, name)
    tensor = reader.adapter.from_dlpack(capsule)
    return _retyped(reader, name, tensor) if reader.retype else tensor


def _view_one(reader: Reader, name: str) -> Any:
    adapter = reader.adapter
    code, shape, begin, end = reader.file.info(name)
    if code in HOST_SWAPS:  # the file's bytes are not the values on this host: read (and swapped) instead
        return _owned_one(reader, name)
    tensor = adapter.view(buffer_of(reader)[begin:end], code, shape)
    return tensor if reader.deliver is None else reader.deliver(tensor, reader.device)


def _view_all_dlpack(reader: Reader) -> Dict[str, Any]:
    views = reader.file.view_all()
    if not reader.retype:  # every capsule is typed: the constructor alone, per tensor
        build = reader.adapter.from_dlpack
        return {name: build(capsule) if capsule is not None else _owned_one(reader, name) for name, capsule in views}
    return {
        name: _from_dlpack(reader, name, capsule) if capsule is not None else _owned_one(reader, name)
        for name, capsule in views
    }


def _view_all(reader: Reader) -> Dict[str, Any]:
    adapter = reader.adapter
    mv, deliver, device = buffer_of(reader), reader.deliver, reader.device
    out = {}
    for name, (code, shape, begin, end) in reader.file.infos():
        if code in HOST_SWAPS:  # read (and swapped) instead of viewed; _owned_one delivers it
            out[name] = _owned_one(reader, name)
        else:
            tensor = adapter.view(mv[begin:end], code, shape)
            out[name] = tensor if deliver is None else deliver(tensor, device)
    return out


def _owned_one_dlpack(reader: Reader, name: str) -> Any:
    tensor = _from_dlpack(reader, name, reader.file.read(name))
    return tensor if reader.deliver is None else reader.deliver(tensor, reader.device)


def _owned_one(reader: Reader, name: str) -> Any:
    if reader.adapter.dlpack:
        return _owned_one_dlpack(reader, name)
    return _from_owned(reader, name, reader.file.read(name, dlpack=False))


def _owned_all(reader: Reader) -> Dict[str, Any]:
    file, dlpack = reader.file, reader.adapter.dlpack
    exports = file.read_all(dlpack=dlpack)
    if dlpack and not reader.retype and reader.deliver is None:  # typed capsules on the CPU: the constructor alone
        build = reader.adapter.from_dlpack
        return {name: build(export) for name, export in exports}
    if dlpack:
        return {name: _from_owned(reader, name, export) for name, export in exports}
    return {name: _from_owned(reader, name, export, code, shape)
            for (name, export), (_, (code, shape, _, _)) in zip(exports, file.infos())}


def _staged_one(reader: Reader, name: str) -> Any:
    staged = reader.adapter.stage(reader.file, [(name, Piece(*reader.file.info(name)))], reader.device)
    return staged[name] if name in staged else _owned_one(reader, name)


def _staged_all(reader: Reader) -> Dict[str, Any]:
    pieces = [(name, Piece(*info)) for name, info in reader.file.infos()]
    staged = reader.adapter.stage(reader.file, pieces, reader.device)
    return {name: staged[name] if name in staged else _owned_one(reader, name) for name, _ in pieces}


class _Row(NamedTuple):
    one: Callable[[Reader, str], Any]
    all: Callable[[Reader], Dict[str, Any]]


#: strategy -> (for adapters that build from memoryviews, for those that build from DLPack capsules).
_TABLE: Dict[str, Tuple[_Row, _Row]] = {
    META: (_Row(_meta_one, _meta_all),) * 2,
    VIEW: (_Row(_view_one, _view_all), _Row(_view_one_dlpack, _view_all_dlpack)),
    OWNED: (_Row(_owned_one, _owned_all), _Row(_owned_one_dlpack, _owned_all)),
    STAGED: (_Row(_staged_one, _staged_all),) * 2,
}


def get_tensor(reader: Reader, name: str) -> Any:
    """One whole tensor, looked up by name."""
    return reader.one(reader, name)


def get_tensors(reader: Reader) -> Dict[str, Any]:
    """Every tensor, in file order."""
    return reader.all(reader)


def load_copies(adapter: Any, file: "_cpp.File", device: Any) -> Dict[str, Any]:
    """Every tensor of ``file`` in memory of its own, on ``device`` (``load(bytes)``)."""
    return get_tensors(Reader(file, adapter, device, backend=None))


# -- slices ---------------------------------------------------------------------------------------------------

def _row_range(plan: Any, shape: Tuple[int, ...]) -> Optional[Tuple[int, int, tuple]]:
    """``(start, stop, index)`` when the plan's rows are one step-1 range of the first dimension (a range, one
    integer, or an Ellipsis in front, standing for every row) and no range has a negative step (which torch
    cannot index): the rows are one byte range, and ``index`` selects the rest from the tensor of those rows,
    as numpy would from the whole (``_takes_whole_rows`` says when it selects them all). Else None."""
    if not shape or plan.gather_axis is not None or plan.needs_reshape:
        return None
    spec = plan.reads()[0]
    try:
        if not spec or any(isinstance(e, slice) and e.step is not None and e.step < 0 for e in spec):
            return None
        inner = tuple(spec[1:])
        first = spec[0]
        if isinstance(first, int):
            index = first + shape[0] if first < 0 else first
            return (index, index + 1, (0,) + inner) if 0 <= index < shape[0] else None
        if isinstance(first, slice) and first.step in (None, 1):
            start, stop, _ = slice(first.start, first.stop).indices(shape[0])
            return start, max(start, stop), (slice(None),) + inner
    except TypeError:
        return None  # bounds that are not integers: the slicer names them
    if first is Ellipsis:
        return 0, shape[0], (Ellipsis,) + inner
    return None


def _takes_whole_rows(index: tuple) -> bool:
    """Whether ``index`` (``_row_range``'s) keeps every element of the rows: one integer or ``:`` for the first
    dimension (not an Ellipsis), then only whole axes."""
    return (isinstance(index[0], int) or index[0] == slice(None)) and all(
        entry is Ellipsis or entry == slice(None) for entry in index[1:])


def _stage_rows(reader: Reader, name: str, code: str, shape: Tuple[int, ...], start: int, stop: int) -> Any:
    """Rows ``[start, stop)`` of tensor ``name`` streamed to the device: one byte range, staged as a tensor."""
    begin, end = _cpp.engine.row_piece(reader.file, name, start, stop)
    piece = Piece(code, (stop - start,) + tuple(shape[1:]), begin, end)
    return reader.adapter.stage(reader.file, [(name, piece)], reader.device)[name]


#: Codes whose elements are whole bytes: a slice of them can be a strided view (F4 and F6 pack values).
_WHOLE_BYTES = frozenset(code for code, row in DTYPES.items() if row.bits % 8 == 0)


def _view_slice(reader: Reader, name: str, code: str, plan: Any) -> Any:
    """The selection as a strided view of the tensor's whole view (the same storage: it keeps the mapping
    alive, as whole-tensor views do), or None where a view cannot show it."""
    native = reader.file.plan_slice(name, plan.spec)  # the slicer's checks, and the view's geometry
    strides = native.strides
    if any(stride < 0 for stride in strides):  # torch has no negative strides
        return None
    capsule = reader.file.view(name)
    if capsule is None:  # a read-only mapping, or bytes this host swaps
        return None
    whole = _from_dlpack(reader, name, capsule)
    tensor = reader.adapter.as_strided(whole, native.shape, strides, native.first_element)
    if plan.needs_reshape:  # new axes (None) only, without an integer list: a view still
        tensor = reader.adapter.reshape(tensor, plan.result_shape(native.shape))
    return tensor


def get_slice(reader: Reader, name: str, code: str, plan: Any) -> Any:
    """What the parsed index ``plan`` (``_slicing.IndexPlan``) selects of tensor ``name``."""
    adapter, file = reader.adapter, reader.file
    reads = plan.reads()
    if reader.strategy == META:
        shape = plan.meta_shape(file.plan_slice(name, reads[0]).shape)
        return adapter.meta(code, shape, reader.device)
    if reader.strategy == VIEW and adapter.dlpack and not plan.lists and code in _WHOLE_BYTES:
        tensor = _view_slice(reader, name, code, plan)
        if tensor is not None:
            return tensor
    if reader.strategy == STAGED and adapter.stages_rows:
        # Rows of the first dimension are one byte range: the engine streams them to the device like a whole
        # tensor. A selection inside one such range of rows (rows[2:9, ::4], w[5, 1:3]) streams those rows and
        # selects on the device. Anything else is read on the CPU and moved.
        _, shape, _, _ = file.info(name)
        rows = _row_range(plan, shape)
        if rows is not None and _takes_whole_rows(rows[2]):
            start, stop, index = rows
            tensor = _stage_rows(reader, name, code, shape, start, stop)
            return tensor[0] if isinstance(index[0], int) else tensor
        if rows is not None and adapter.selects(code, shape):
            start, stop, index = rows
            want = tuple(file.plan_slice(name, reads[0]).shape)  # the slicer's checks first
            tensor = adapter.select(_stage_rows(reader, name, code, shape, start, stop), index)
            if tuple(tensor.shape) == want:
                return tensor
    parts = []
    for spec in reads:
        native = file.plan_slice(name, spec)
        tensor, ptr = adapter.empty(code, native.shape)
        if native.nbytes:
            file.read_slice(name, native, ptr)
        parts.append(adapter.finish(tensor, code, native.shape))
    tensor = parts[0] if plan.gather_axis is None else adapter.stack(parts, plan.gather_axis)
    if plan.needs_reshape:
        tensor = adapter.reshape(tensor, plan.result_shape(tuple(tensor.shape)))
    return adapter.to_device(tensor, reader.device)
