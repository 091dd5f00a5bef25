"""``safetensors diff``: tensors only in one checkpoint, different dtype or shape, different values (for floats
also the largest absolute difference), and metadata merged over each checkpoint's files."""

from __future__ import annotations

import argparse
from typing import IO, Any, Dict, List, Optional, Set, Tuple

from .. import _safetensors_cpp as _cpp
from .._core import DTYPES, Piece
from .._safetensors_cpp import SafetensorError
from .common import (
    EXIT_FAILED,
    EXIT_OK,
    CliError,
    chunks_of,
    describe_error,
    is_float,
    count_of,
    numel,
    numpy_module,
    one_line,
    resolve_checkpoint,
    Scratch,
    shape_text,
)

class _Side:
    """One side of a diff: every tensor of a checkpoint by name, and its files' metadata merged. The checkpoint
    is opened as one ShardedFile: from its index (each shard holding what the index assigns), or from its
    files (a tensor name in two files is an error), both rules the C++ library's."""

    def __init__(self, path: str) -> None:
        checkpoint = resolve_checkpoint(path)
        self.path = path
        try:
            if checkpoint.index_path is not None:
                opened = _cpp.sharded.ShardedFile.open_index(checkpoint.index_path, "pread")
            else:
                opened = _cpp.sharded.ShardedFile.open_files([shard.path for shard in checkpoint.shards], "pread")
        except (SafetensorError, OSError) as e:
            raise CliError(describe_error(e)) from None
        files = opened.shards
        self.tensors: Dict[str, Tuple["_cpp.File", Piece]] = {
            name: (files[opened.shard_of(name)], Piece(*info)) for name, info in opened.infos()
        }
        values: Dict[str, Set[str]] = {}
        for file in files:
            for key, value in (file.metadata() or {}).items():
                values.setdefault(key, set()).add(value)
        # A key whose value differs between shards of one checkpoint shows all of its values.
        self.metadata = {key: " | ".join(sorted(v)) for key, v in values.items()}


def _decode(np: Any, types: Dict[str, Any], view: memoryview, code: str) -> Tuple[Any, Optional[Any]]:
    """One piece of a tensor as (its elements as unsigned integers, for exact comparison; the same elements
    typed, for a float code numpy can hold, else None). Both are views of ``view`` without copies, except
    that sub-byte codes are unpacked to one element per byte."""
    bits = DTYPES[code].bits
    dtype = types.get(code)
    if bits % 8:
        if dtype is None:
            return np.frombuffer(view, dtype=np.uint8), None
        from .._numpy_bridge import unpack

        elements = unpack(np.frombuffer(view, dtype=np.uint8), code, (len(view) * 8 // bits,))
        return elements.view(np.uint8), elements
    raw = np.frombuffer(view, dtype=f"<u{bits // 8}")
    if not is_float(code) or dtype is None:
        return raw, None
    return raw, np.frombuffer(view, dtype=dtype)


class _ValueDiff:
    """Accumulates, piece by piece, how two tensors of one dtype and shape differ."""

    def __init__(self, np: Any, types: Dict[str, Any], code: str) -> None:
        self.np = np
        self.types = types
        self.code = code
        self.differing = 0
        self.max_abs: Optional[float] = None
        self.nan_mismatch = 0
        self.has_values = is_float(code) and code in types

    def add(self, a: memoryview, b: memoryview) -> None:
        np = self.np
        ea, fa = _decode(np, self.types, a, self.code)
        eb, fb = _decode(np, self.types, b, self.code)
        mask = ea != eb
        count = int(np.count_nonzero(mask))
        if not count:
            return
        self.differing += count
        if fa is None or fb is None:
            return
        wide = np.complex128 if self.code == "C64" else np.float64
        fa, fb = fa[mask].astype(wide), fb[mask].astype(wide)
        with np.errstate(all="ignore"):
            nan_a, nan_b = np.isnan(fa), np.isnan(fb)
            one_nan = nan_a != nan_b
            self.nan_mismatch += int(np.count_nonzero(one_nan))
            diff = np.abs(fa - fb).astype(np.float64)
            # Equal values with different bits (+0/-0, NaN payloads, the same infinity) differ by nothing.
            diff[(nan_a & nan_b) | (fa == fb)] = 0.0
            diff = diff[~one_nan]
        if diff.size:
            peak = float(diff.max())
            self.max_abs = peak if self.max_abs is None else max(self.max_abs, peak)

    def describe(self, total: int) -> str:
        if DTYPES[self.code].bits % 8 and self.code not in self.types:
            return f"{self.differing:,} bytes differ (install ml_dtypes to compare {self.code} elements)"
        text = f"{self.differing:,} of {total:,} elements differ"
        if self.has_values:
            if self.max_abs is not None:
                text += f", max abs diff {self.max_abs:.6g}"
            if self.nan_mismatch:
                text += f", {self.nan_mismatch:,} NaN on one side only"
        elif is_float(self.code):
            text += " (install ml_dtypes for the max abs diff of this dtype)"
        return text


def cmd_diff(args: argparse.Namespace, stdout: IO[str], stderr: IO[str]) -> int:
    np = numpy_module()
    from .._numpy_bridge import TYPES as types  # noqa: N811

    a, b = _Side(args.a), _Side(args.b)
    lines: List[str] = []
    compared = same_bytes = 0
    for name in sorted(a.tensors.keys() | b.tensors.keys()):
        if name not in b.tensors:
            code, shape = a.tensors[name][1].code, a.tensors[name][1].shape
            lines.append(f"only in A: {name}  {code} {shape_text(shape)}")
            continue
        if name not in a.tensors:
            code, shape = b.tensors[name][1].code, b.tensors[name][1].shape
            lines.append(f"only in B: {name}  {code} {shape_text(shape)}")
            continue
        (fa, ia), (fb, ib) = a.tensors[name], b.tensors[name]
        if (ia.code, ia.shape) != (ib.code, ib.shape):
            lines.append(f"dtype/shape differ: {name}  {ia.code} {shape_text(ia.shape)} -> {ib.code} "
                         f"{shape_text(ib.shape)}")
            continue
        compared += 1
        values = _ValueDiff(np, types, ia.code)
        try:
            pieces_b = chunks_of(fb, name, ib, Scratch())
            for piece_a in chunks_of(fa, name, ia, Scratch()):
                values.add(piece_a, next(pieces_b))
        except (SafetensorError, OSError) as e:
            raise CliError(describe_error(e)) from None
        if values.differing:
            lines.append(f"values differ: {name}  {ia.code} {shape_text(ia.shape)}: "
                         f"{values.describe(numel(ia.shape))}")
        else:
            same_bytes += ia.nbytes
    for key in sorted(a.metadata.keys() | b.metadata.keys()):
        va, vb = a.metadata.get(key), b.metadata.get(key)
        if vb is None:
            lines.append(f"metadata only in A: {one_line(key)} = {one_line(va, 80)!r}")
        elif va is None:
            lines.append(f"metadata only in B: {one_line(key)} = {one_line(vb, 80)!r}")
        elif va != vb:
            lines.append(f"metadata differs: {one_line(key)}: {one_line(va, 80)!r} -> {one_line(vb, 80)!r}")
    stdout.write(f"A: {args.a}\nB: {args.b}\n")
    for line in lines:
        stdout.write(line + "\n")
    if lines:
        stdout.write(f"{count_of(len(lines), 'difference')} ({count_of(compared, 'tensor')} compared)\n")
        return EXIT_FAILED
    stdout.write(
        f"identical: {count_of(compared, 'tensor')}, {same_bytes:,} bytes of tensor data, {count_of(len(a.metadata), 'metadata entry')}\n"
    )
    return EXIT_OK
