"""Safetensors files put together by several writers: each file's layout computed from names, dtypes and shapes
alone, a temporary file per final file, every piece written at its final offsets, then a rename into place.

The layout is the C++ writer's (``WritePlan::make`` through ``_safetensors_cpp.plan_file``): the same names,
dtypes, shapes and metadata give the bytes ``safetensors.torch.save_file`` writes, so a file assembled from
pieces is byte-identical to one saved whole. ``save_state_dict`` (``_save``) and the DCP writer
(``safetensors.dcp``) both write through here.

Crash ordering (as ``save_file``'s, spread over processes): every writer fsyncs its writes to the temporary
files; only then (the callers' barrier) is each renamed over its final name, and the directory fsynced. A
failure before the renames removes the temporaries and leaves every final name as it was.
"""

from __future__ import annotations

import os
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple

import torch

from .. import _safetensors_cpp as _cpp
from .._core import HOST_SWAPS, TORCH_PACKED, Box, SafetensorError, to_little_endian
from .._torch_types import CODES, SIZE, TYPES, as_bytes

__all__ = [
    "FileLayout",
    "WritePiece",
    "TensorDesc",
    "create_temporary",
    "dtype_code",
    "fsync_directory",
    "nbytes",
    "plan_file",
    "publish",
    "remove_quietly",
    "temporary_name",
    "write_piece",
    "write_pieces",
]

#: (name, dtype code, torch shape): what every rank must agree on for one tensor.
TensorDesc = Tuple[str, str, Tuple[int, ...]]


class WritePiece(NamedTuple):
    """What one writer writes of one tensor: ``box`` of the tensor of torch's ``shape`` whose bytes start at
    ``begin`` of ``file_name``, from ``local`` (any device, any layout: copied to a contiguous CPU tensor)."""

    file_name: str
    name: str
    begin: int
    shape: Tuple[int, ...]
    box: Box
    local: torch.Tensor


class FileLayout(NamedTuple):
    """One final file: its name in the directory, its first bytes (length, header, padding), its size, and
    where each tensor's bytes start and end in it (absolute offsets, ``[begin, end)``)."""

    file_name: str
    prefix: bytes
    size: int
    offsets: Dict[str, Tuple[int, int]]


def dtype_code(name: str, dtype: torch.dtype) -> str:
    """The format code of ``dtype``; SafetensorError naming ``name`` where safetensors cannot store it."""
    code = CODES.get(dtype)
    if code is None:
        raise SafetensorError(f"tensor `{name}` has dtype {dtype}, which safetensors cannot store")
    return code


def nbytes(code: str, shape: Sequence[int]) -> int:
    """Bytes of a tensor of ``code`` and torch's ``shape`` (float4_e2m1fn_x2 elements are one byte each)."""
    size = SIZE[TYPES[code]]
    for s in shape:
        size *= int(s)
    return size


def plan_file(file_name: str, descs: Sequence[TensorDesc], metadata: Optional[Dict[str, str]]) -> FileLayout:
    """The layout of ``file_name`` holding ``descs``, as ``save_file(tensors, metadata=metadata)`` writes it."""
    header = []
    for name, code, shape in descs:
        if code in TORCH_PACKED:
            if not shape:
                raise SafetensorError(f"tensor `{name}`: a packed {code} scalar has no shape to hold its values")
            shape = tuple(_cpp.header_shape(code, list(shape)))
        header.append((name, code, list(shape)))
    prefix, entries = _cpp.plan_file(header, list(metadata.items()) if metadata is not None else None)
    base = len(prefix)
    end = max((e for _, _, e in entries), default=0)
    return FileLayout(file_name, prefix, base + end, {name: (base + b, base + e) for name, b, e in entries})


def temporary_name(file_name: str, token: str) -> str:
    """The temporary name of ``file_name`` during the save identified by ``token`` (hidden, same directory)."""
    return f".{file_name}.{token}.tmp"


def create_temporary(directory: str, layout: FileLayout, token: str) -> None:
    """Creates the temporary file of ``layout`` at its full size with its prefix written and synced; refuses
    to reuse an existing name."""
    path = os.path.join(directory, temporary_name(layout.file_name, token))
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o666)
    try:
        os.ftruncate(fd, layout.size)
        os.pwrite(fd, layout.prefix, 0)
        os.fsync(fd)
    finally:
        os.close(fd)


def write_piece(fd: int, offset: int, shape: Tuple[int, ...], box: Box, local: torch.Tensor, what: str) -> None:
    """Writes ``local`` (the C-contiguous CPU tensor holding ``box`` of a tensor of torch's ``shape``) into the
    tensor's bytes at ``offset`` of ``fd``: the one write seam of the package's multi-writer saves.

    A box of whole rows (or the whole tensor) is one positional write; a box that cuts an inner dimension is
    one write per run of its innermost cut dimension, done natively with the GIL released (``pwrite_box``):
    each rank writes the bytes it holds where they go, with no exchange of data between ranks -- sending the
    rows to one owner would move every byte over the network once more to save a few system calls."""
    item = local.element_size()
    code = CODES.get(local.dtype)
    if code in HOST_SWAPS:  # a big-endian host: the file's bytes are little-endian, swapped in a copy
        raw = bytearray(to_little_endian(as_bytes(local).numpy().tobytes(), code))
        local = torch.frombuffer(raw, dtype=torch.uint8) if raw else local
    _cpp.pwrite_box(fd, offset, list(shape), [tuple(b) for b in box], item, local.data_ptr(),
                    local.numel() * local.element_size(), what)


def write_pieces(directory: str, token: str, pieces: Sequence[WritePiece]) -> int:
    """Writes ``pieces`` into the temporary files of the save ``token``, then fsyncs each file it wrote to.
    Returns the bytes written. SafetensorError names the directory where a temporary is not there (the ranks
    do not share the directory)."""
    fds: Dict[str, int] = {}
    written = 0
    try:
        for piece in pieces:
            if piece.file_name not in fds:
                path = os.path.join(directory, temporary_name(piece.file_name, token))
                try:
                    fds[piece.file_name] = os.open(path, os.O_WRONLY | getattr(os, "O_CLOEXEC", 0))
                except FileNotFoundError:
                    raise SafetensorError(
                        f"directory {directory} is not shared by the ranks: this rank cannot see {path}, which "
                        "the coordinating rank created (every rank must save to the same directory on a "
                        "filesystem they all see)") from None
            local = piece.local.detach()
            if local.device.type != "cpu":
                local = local.to("cpu")
            local = local.contiguous()
            write_piece(fds[piece.file_name], piece.begin, piece.shape, piece.box, local,
                        f"{directory}/{piece.file_name} (tensor {piece.name})")
            written += local.numel() * local.element_size()
        for fd in fds.values():
            os.fsync(fd)
    finally:
        for fd in fds.values():
            os.close(fd)
    return written


def fsync_directory(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def publish(directory: str, renames: Sequence[Tuple[str, str]]) -> None:
    """Renames each ``(temporary name, final name)`` in ``directory``, then fsyncs the directory.
    REQUIRES: every writer has synced its writes to the temporaries."""
    for temporary, final in renames:
        os.replace(os.path.join(directory, temporary), os.path.join(directory, final))
    fsync_directory(directory)


def remove_quietly(directory: str, names: Sequence[str]) -> List[str]:
    """Removes ``names`` from ``directory`` where they exist; returns the names that could not be removed."""
    failed = []
    for name in names:
        try:
            os.unlink(os.path.join(directory, name))
        except FileNotFoundError:
            pass
        except OSError:
            failed.append(name)
    return failed
