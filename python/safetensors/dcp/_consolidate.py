"""``consolidate``: the full safetensors files from a directory of DCP shard files (torch's
``HuggingFaceStorageWriter(save_distributed=True)`` output: files whose ``DCP_SHARDING_INFO`` metadata gives
each tensor's ``saved_offsets`` in the full tensor).

Streaming: each shard tensor (a box of a full tensor, C-contiguous in its file) is read in slabs of at most
``buffer_bytes`` -- whole runs of its leading dimensions, one read each -- into one reused buffer, and each
slab is written at its final offsets (``_files.write_piece``: one positional write per run it makes in the
output). Memory is that buffer, whatever the tensors' sizes. The output files are laid out, written under
temporary names, synced and renamed into place as ``safetensors.distributed`` writes them: each is
byte-identical to ``save_file(its full tensors, metadata={"format": "pt"})``.
"""

from __future__ import annotations

import ctypes
import json
import os
import secrets
from typing import Dict, Iterator, List, Optional, Tuple


from .. import _safetensors_cpp as _cpp
from .._core import DTYPES, PathLike, SafetensorError
from ..distributed._files import create_temporary, publish, remove_quietly, temporary_name
from ._writer import plan_outputs, write_index

__all__ = ["DEFAULT_BUFFER_BYTES", "consolidate", "slabs"]

#: The one read buffer's size: the most memory a consolidation holds for tensor data.
DEFAULT_BUFFER_BYTES = 64 << 20
SHARDING_KEY = "DCP_SHARDING_INFO"

#: (shard file, its data start, begin of the tensor in its data, the box's shape, its offset in the full tensor)
ShardPart = Tuple[str, int, int, Tuple[int, ...], Tuple[int, ...]]


def slabs(shape: Tuple[int, ...], item: int, limit: int) -> Iterator[Tuple[int, Tuple[Tuple[int, int], ...]]]:
    """Cuts a C-contiguous array of ``shape`` (``item`` bytes per element) into pieces of at most ``limit``
    bytes (at least one element), each contiguous in it: ``(byte offset, box relative to the array)``."""
    if any(s == 0 for s in shape):
        return
    stride = [item] * (len(shape) + 1)
    for d in range(len(shape) - 1, -1, -1):
        stride[d] = stride[d + 1] * shape[d]

    def cut(d: int, lead: Tuple[int, ...], at: int) -> Iterator[Tuple[int, Tuple[Tuple[int, int], ...]]]:
        fixed = tuple((i, i + 1) for i in lead)
        if d == len(shape):
            yield at, fixed
            return
        per = stride[d + 1]
        if per <= limit or d == len(shape) - 1:
            step = max(1, limit // per)
            for start in range(0, shape[d], step):
                stop = min(shape[d], start + step)
                yield at + start * per, fixed + ((start, stop),) + tuple((0, s) for s in shape[d + 1:])
        else:
            for i in range(shape[d]):
                yield from cut(d + 1, lead + (i,), at + i * per)

    yield from cut(0, (), 0)


def _scan(sharded_dir: str) -> Tuple[List[Tuple[str, str, Tuple[int, ...]]], Dict[str, List[ShardPart]]]:
    """Full tensors (name, code, header shape) in first-seen order, and every shard part of each."""
    names = sorted(n for n in os.listdir(sharded_dir) if n.endswith(".safetensors"))
    if not names:
        raise SafetensorError(f"{sharded_dir}: no .safetensors files to consolidate")
    codes: Dict[str, str] = {}
    sizes: Dict[str, List[int]] = {}
    parts: Dict[str, List[ShardPart]] = {}
    for name in names:
        path = os.path.join(sharded_dir, name)
        f = _cpp.File(path, "pread")
        info = (f.metadata() or {}).get(SHARDING_KEY)
        if info is None:
            raise SafetensorError(f"{path}: no {SHARDING_KEY} metadata: not a DCP shard file (torch's "
                                  "HuggingFaceStorageWriter with save_distributed=True writes those)")
        offsets = json.loads(info)
        for tensor, (code, shape, begin, _end) in f.infos():
            if DTYPES[code].bits % 8:
                raise SafetensorError(f"{path}: tensor {tensor} has sub-byte dtype {code}, which cannot be "
                                      "consolidated")
            at = tuple(int(o) for o in offsets[tensor]["saved_offsets"])
            if codes.setdefault(tensor, code) != code:
                raise SafetensorError(f"tensor {tensor}: shards disagree on its dtype ({codes[tensor]}, {code})")
            full = sizes.setdefault(tensor, [0] * len(shape))
            sizes[tensor] = [max(a, s + o) for a, s, o in zip(full, shape, at)]
            parts.setdefault(tensor, []).append((path, f.data_offset, begin, tuple(shape), at))
    return [(t, codes[t], tuple(sizes[t])) for t in codes], parts


def consolidate(sharded_dir: PathLike, out_dir: PathLike, fqn_to_index_mapping: Optional[Dict[str, int]] = None,
                *, buffer_bytes: int = DEFAULT_BUFFER_BYTES) -> List[str]:
    """Writes the full files of the DCP shard files in ``sharded_dir`` into ``out_dir`` (created if missing):
    ``model-0000i-of-0000N.safetensors`` per ``fqn_to_index_mapping`` (fqn -> 1..N), else one
    ``model-00001-of-00001.safetensors``, each byte-identical to ``save_file(its full tensors,
    metadata={"format": "pt"})``, and ``model.safetensors.index.json`` as torch writes it. Reads each shard's
    bytes once, holding at most ``buffer_bytes`` of tensor data. Files appear under their final names only when
    all are complete (a failure leaves ``out_dir`` as it was). Returns the names of the files written.

    Raises SafetensorError for a file without DCP sharding metadata, shards that disagree, or parts that do
    not cover a tensor; OSError for I/O errors."""
    sharded_dir, out_dir = os.fspath(sharded_dir), os.fspath(out_dir)
    descs, parts = _scan(sharded_dir)
    layouts = plan_outputs(descs, fqn_to_index_mapping)
    os.makedirs(out_dir, exist_ok=True)
    token = secrets.token_hex(8)
    temporaries = [temporary_name(f.file_name, token) for f in layouts]
    buffer = bytearray(max(int(buffer_bytes), 64))
    address = ctypes.addressof(ctypes.c_char.from_buffer(buffer))
    view = memoryview(buffer)
    try:
        for layout in layouts:
            create_temporary(out_dir, layout, token)
            fd = os.open(os.path.join(out_dir, temporary_name(layout.file_name, token)), os.O_WRONLY)
            try:
                for tensor, (begin, end) in layout.offsets.items():
                    code = next(c for n, c, _ in descs if n == tensor)
                    _copy_tensor(fd, begin, end, tensor, code, parts[tensor], view, address, layout.file_name)
                os.fsync(fd)
            finally:
                os.close(fd)
        publish(out_dir, [(t, f.file_name) for t, f in zip(temporaries, layouts)])
    except BaseException:
        remove_quietly(out_dir, temporaries)
        raise
    write_index(out_dir, layouts, token)
    return [f.file_name for f in layouts]


def _copy_tensor(fd: int, begin: int, end: int, tensor: str, code: str, parts: List[ShardPart],
                 view: memoryview, address: int, file_name: str) -> None:
    item = DTYPES[code].bits // 8
    full = _full_shape(parts)
    covered = 0
    for path, data_start, at_begin, shape, offset in parts:
        n = item
        for s in shape:
            n *= s
        covered += n
        src = os.open(path, os.O_RDONLY)
        try:
            for at, rel in slabs(shape, item, len(view)):
                box = tuple((o + a, o + b) for o, (a, b) in zip(offset, rel))
                size = item
                for a, b in rel:
                    size *= b - a
                got = os.preadv(src, [view[:size]], data_start + at_begin + at)
                if got != size:
                    raise SafetensorError(f"{path}: tensor {tensor}: file ends early")
                _cpp.pwrite_box(fd, begin, list(full), list(box), item, address, size, f"{file_name} ({tensor})")
        finally:
            os.close(src)
    if covered != end - begin:
        raise SafetensorError(f"tensor {tensor}: the shard files hold {covered} of its {end - begin} bytes "
                              "(parts missing or overlapping)")


def _full_shape(parts: List[ShardPart]) -> Tuple[int, ...]:
    size = [0] * len(parts[0][3])
    for *_, shape, offset in parts:
        size = [max(a, s + o) for a, s, o in zip(size, shape, offset)]
    return tuple(size)

