"""The ``safetensors`` command-line tool: inspect, verify, convert and diff checkpoints.

Also runs as ``python -m safetensors._cli``. Exit codes: 0 success; 1 a verification failure, NaN/Inf found
by ``verify --scan``, or ``diff`` found differences; 2 a usage or input error (a missing file, a file that is
not a safetensors file, an existing output), reported as one line naming the file.

``inspect`` and ``verify`` need nothing beyond this package; ``verify --scan`` and ``diff`` need numpy
(ml_dtypes for bfloat16/float8 values); ``convert`` needs torch.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import re
import sys
import threading
import time
import zipfile
from typing import IO, Any, Dict, Iterator, List, Optional, Sequence, Set, Tuple

from . import _safetensors_cpp as _cpp
from ._core import DTYPES
from ._safetensors_cpp import SafetensorError
from ._sharding import (
    INDEX_SUFFIX,
    SAFETENSORS_SUFFIX,
    Checkpoint,
    CheckpointError,
    IndexFormatError,
    Shard,
    format_size,
    parse_size,
    plan_shards,
    resolve,
    shard_file_names,
    write_index,
)

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2

PROG = "safetensors"

#: Tensors larger than this are read in row ranges of about this size, so memory stays bounded.
CHUNK_BYTES = 64 * 2**20

Info = Tuple[str, Tuple[int, ...], int, int]  # (dtype code, shape, begin, end), as File.infos() gives


class CliError(Exception):
    """A usage or input error: printed as one line, exit status 2."""


# -- small helpers -----------------------------------------------------------------------------------------

def _describe_error(error: BaseException) -> str:
    """One line for an exception from opening or reading a file; the message names the file."""
    if isinstance(error, OSError) and error.filename is not None and error.strerror:
        return f"{error.filename}: {error.strerror}"
    return " ".join(str(error).split())


def _open(path: str) -> "_cpp.File":
    """Opens and validates the header of ``path``. Tensor bytes are read on demand with positional reads."""
    return _cpp.File(path, "pread")


def _numel(shape: Sequence[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _n(count: int, noun: str) -> str:
    """``_n(1, "file")`` -> ``"1 file"``, ``_n(3, "metadata entry")`` -> ``"3 metadata entries"``."""
    if count == 1:
        return f"1 {noun}"
    plural = noun[:-1] + "ies" if noun.endswith("y") else noun + "s"
    return f"{count:,} {plural}"


def _shape_text(shape: Sequence[int]) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"


def _is_float(code: str) -> bool:
    # Every floating-point code starts with F (F4, F6_*, F8_*, F16, F32, F64), plus BF16 and complex C64.
    return code.startswith(("F", "BF", "C"))


def _one_line(value: str, limit: int = 200) -> str:
    text = value.replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r").replace("\t", "\\t")
    if len(text) > limit:
        return f"{text[:limit]}... ({len(value)} characters)"
    return text


def _numpy() -> Any:
    try:
        import numpy
    except ImportError:
        raise CliError("this command needs numpy: pip install numpy ml_dtypes") from None
    return numpy


class _Scratch:
    """A reusable read buffer: one allocation per size increase instead of one per tensor."""

    def __init__(self) -> None:
        self._buf = bytearray()
        self._addr = 0

    def get(self, nbytes: int) -> Tuple[int, memoryview]:
        if len(self._buf) < nbytes:
            self._buf = bytearray(nbytes)
            self._addr = ctypes.addressof(ctypes.c_char.from_buffer(self._buf))
        return self._addr, memoryview(self._buf)[:nbytes]


def _chunks(file: "_cpp.File", name: str, info: Info, scratch: _Scratch) -> Iterator[memoryview]:
    """The bytes of one tensor, read in pieces of about CHUNK_BYTES (whole rows of the first dimension; a
    tensor that cannot be split that way, or a sub-byte one, is read whole). Each piece is valid until the
    next one is read."""
    code, shape, begin, end = info
    nbytes = end - begin
    if nbytes == 0:
        return
    rows = shape[0] if shape else 1
    if nbytes <= CHUNK_BYTES or rows <= 1 or DTYPES[code].bits % 8:
        addr, view = scratch.get(nbytes)
        file.read_into(name, addr, nbytes)
        yield view
        return
    step = max(1, CHUNK_BYTES // (nbytes // rows))
    for start in range(0, rows, step):
        plan = file.plan_slice(name, [(1, start, min(rows, start + step), 1)])
        addr, view = scratch.get(plan.nbytes)
        file.read_slice(name, plan, addr)
        yield view


class _Progress:
    """A one-line progress bar on a terminal; silent when disabled. Redraws at most ten times a second."""

    WIDTH = 30

    def __init__(self, label: str, total: int, stream: IO[str], enabled: bool) -> None:
        self.label = label
        self.total = total
        self.done = 0
        self.stream = stream
        self.enabled = enabled
        self._last = 0.0
        self._drawn: Optional[int] = None  # the value on screen, None when nothing is
        self._lock = threading.Lock()

    def update(self, done: int, force: bool = False) -> None:
        if not self.enabled:
            return
        with self._lock:
            self.done = max(self.done, min(done, self.total))
            now = time.monotonic()
            if not force and now - self._last < 0.1:
                return
            self._draw(now)

    def _draw(self, now: float) -> None:
        self._last = now
        self._drawn = self.done
        fraction = self.done / self.total if self.total else 1.0
        filled = int(fraction * self.WIDTH)
        bar = "#" * filled + "." * (self.WIDTH - filled)
        self.stream.write(
            f"\r{self.label} [{bar}] {int(fraction * 100):3d}% {format_size(self.done)}/{format_size(self.total)}"
        )
        self.stream.flush()

    def clear(self) -> None:
        """Erases the bar, so a line can be printed; the next update draws it again."""
        if self.enabled and self._drawn is not None:
            with self._lock:
                self.stream.write("\r\x1b[K")
                self.stream.flush()
                self._last = 0.0
                self._drawn = None

    def close(self) -> None:
        """Draws the final state (unless it is already shown) and ends the line; the bar is then disabled."""
        if self.enabled:
            with self._lock:
                self.done = self.total
                if self._drawn != self.done:
                    self._draw(time.monotonic())
                self.stream.write("\n")
                self.stream.flush()
                self.enabled = False


def _written_bytes() -> Optional[int]:
    """Bytes this process has passed to write calls so far (Linux), or None where that is not known."""
    try:
        with open("/proc/self/io", "rb") as f:
            for line in f:
                if line.startswith(b"wchar:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


class _WriteWatcher:
    """While a native call writes a file (with the GIL released), advances a progress bar from this
    process's write count; where that count is unavailable the bar moves when the call returns."""

    def __init__(self, progress: _Progress, base: int, nbytes: int) -> None:
        self._progress = progress
        self._base = base
        self._nbytes = nbytes
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def __enter__(self) -> "_WriteWatcher":
        start = _written_bytes() if self._progress.enabled else None
        if start is not None:
            def poll() -> None:
                while not self._stop.wait(0.1):
                    now = _written_bytes()
                    if now is not None:
                        self._progress.update(self._base + min(self._nbytes, now - start))

            self._thread = threading.Thread(target=poll, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if exc[0] is None:
            self._progress.update(self._base + self._nbytes)


# -- opening checkpoints -----------------------------------------------------------------------------------

def _resolve(path: str) -> Checkpoint:
    try:
        return resolve(path)
    except CheckpointError as e:
        raise CliError(str(e)) from None
    except OSError as e:
        raise CliError(_describe_error(e)) from None


class _OpenShard:
    """A shard opened for reading, with the tensors the checkpoint takes from it (file order)."""

    def __init__(self, shard: Shard, file: "_cpp.File", tensors: List[Tuple[str, Info]]) -> None:
        self.shard = shard
        self.file = file
        self.tensors = tensors


def _open_shard(checkpoint: Checkpoint, shard: Shard) -> _OpenShard:
    """Opens one shard; an index naming a missing shard, or a tensor the shard lacks, is a CliError."""
    if checkpoint.index_path is not None and not os.path.exists(shard.path):
        raise CliError(f"{shard.path}: no such file, but the index {checkpoint.index_path} names it")
    try:
        file = _open(shard.path)
    except (SafetensorError, OSError) as e:
        raise CliError(_describe_error(e)) from None
    infos = file.infos()
    if shard.names is None:
        return _OpenShard(shard, file, infos)
    wanted = set(shard.names)
    missing = sorted(wanted - set(file.keys()))
    if missing:
        raise CliError(
            f"{shard.path}: does not hold {_name_list(missing)}, which the index {checkpoint.index_path} assigns to it"
        )
    return _OpenShard(shard, file, [(name, info) for name, info in infos if name in wanted])


def _name_list(names: Sequence[str], limit: int = 5) -> str:
    shown = ", ".join(repr(n) for n in names[:limit])
    more = len(names) - limit
    noun = "tensor" if len(names) == 1 else "tensors"
    return f"{noun} {shown}" + (f" and {more} more" if more > 0 else "")


# -- inspect -----------------------------------------------------------------------------------------------

def _inspect_document(checkpoint: Checkpoint, opened: List[_OpenShard]) -> Dict[str, Any]:
    parameters: Dict[str, int] = {}
    total_bytes = 0
    files = []
    for item in opened:
        tensors = []
        for name, (code, shape, begin, end) in item.tensors:
            count = _numel(shape)
            parameters[code] = parameters.get(code, 0) + count
            total_bytes += end - begin
            tensors.append(
                {
                    "name": name,
                    "dtype": code,
                    "shape": list(shape),
                    "parameters": count,
                    "nbytes": end - begin,
                    "data_offsets": [begin, end],
                }
            )
        files.append(
            {
                "path": item.shard.path,
                "file_size": item.file.size,
                "header_size": item.file.header_length,
                "metadata": item.file.metadata(),
                "tensors": tensors,
            }
        )
    ordered = dict(sorted(parameters.items(), key=lambda kv: (-kv[1], kv[0])))
    index = None
    if checkpoint.index_path is not None:
        index = {"path": checkpoint.index_path, "metadata": checkpoint.index_metadata}
    return {
        "path": checkpoint.path,
        "kind": checkpoint.kind,
        "index": index,
        "files": files,
        "parameters": ordered,
        "total_parameters": sum(parameters.values()),
        "total_bytes": total_bytes,
    }


def _table(rows: List[Sequence[str]], right: Set[int], indent: str = "  ") -> List[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = []
    for row in rows:
        cells = [cell.rjust(w) if i in right else cell.ljust(w) for i, (cell, w) in enumerate(zip(row, widths))]
        lines.append((indent + "  ".join(cells)).rstrip())
    return lines


def _metadata_lines(metadata: Optional[Dict[str, Any]], indent: str) -> List[str]:
    if metadata is None:
        return [f"{indent}(none)"]
    if not metadata:
        return [f"{indent}(empty)"]
    return [f"{indent}{_one_line(str(k))}: {_one_line(str(v))}" for k, v in metadata.items()]


def _inspect_text(doc: Dict[str, Any]) -> str:
    out: List[str] = []
    files = doc["files"]
    if doc["index"] is not None:
        count = sum(len(f["tensors"]) for f in files)
        out.append(f"index {doc['index']['path']}: {_n(count, 'tensor')} in {_n(len(files), 'file')}")
        out.append("  metadata:")
        out.extend(_metadata_lines(doc["index"]["metadata"], "    "))
    same_metadata = len(files) > 1 and all(f["metadata"] == files[0]["metadata"] for f in files)
    for f in files:
        tensors = f["tensors"]
        data = sum(t["nbytes"] for t in tensors)
        if out:
            out.append("")
        out.append(
            f"{f['path']}: {_n(len(tensors), 'tensor')}, {format_size(data)} of data, "
            f"{f['file_size']:,} bytes (header {f['header_size']:,} bytes)"
        )
        if tensors:
            rows: List[Sequence[str]] = [("name", "dtype", "shape", "size", "offsets")]
            for t in tensors:
                begin, end = t["data_offsets"]
                rows.append((t["name"], t["dtype"], _shape_text(t["shape"]), format_size(t["nbytes"]), f"[{begin}, {end})"))
            out.extend(_table(rows, right={3}))
        if not same_metadata:
            out.append("  metadata:")
            out.extend(_metadata_lines(f["metadata"], "    "))
    if same_metadata:
        out.append("")
        out.append(f"metadata (the same in all {len(files)} files):")
        out.extend(_metadata_lines(files[0]["metadata"], "  "))
    out.append("")
    out.append("parameters by dtype:")
    rows = [(code, f"{count:,}") for code, count in doc["parameters"].items()]
    rows.append(("total", f"{doc['total_parameters']:,}"))
    out.extend(_table(rows, right={1}))
    total = doc["total_bytes"]
    out.append(f"total bytes: {total:,} ({format_size(total)}) of tensor data in {_n(len(files), 'file')}")
    return "\n".join(out) + "\n"


def cmd_inspect(args: argparse.Namespace, stdout: IO[str], stderr: IO[str]) -> int:
    checkpoint = _resolve(args.path)
    opened = [_open_shard(checkpoint, shard) for shard in checkpoint.shards]
    doc = _inspect_document(checkpoint, opened)
    if args.json:
        stdout.write(json.dumps(doc, indent=2, ensure_ascii=False) + "\n")
    else:
        stdout.write(_inspect_text(doc))
    return EXIT_OK


# -- verify ------------------------------------------------------------------------------------------------

def _scan(np: Any, types: Dict[str, Any], code: str, view: memoryview) -> Tuple[int, int]:
    """(NaN count, Inf count) in one piece of a float tensor. Sub-byte floats (F4, F6) have neither."""
    dtype = types.get(code)
    if dtype is None or DTYPES[code].bits % 8:
        return 0, 0
    values = np.frombuffer(view, dtype=dtype)
    with np.errstate(all="ignore"):
        return int(np.count_nonzero(np.isnan(values))), int(np.count_nonzero(np.isinf(values)))


def cmd_verify(args: argparse.Namespace, stdout: IO[str], stderr: IO[str]) -> int:
    np = types = None
    if args.scan:
        np = _numpy()
        from .numpy import _TYPES as types  # noqa: N811 - the numpy module's code -> dtype table
    try:
        checkpoint = resolve(args.path)
    except IndexFormatError as e:
        stdout.write(f"FAIL  {e}\n")
        return EXIT_FAILED
    except CheckpointError as e:
        raise CliError(str(e)) from None
    except OSError as e:
        raise CliError(_describe_error(e)) from None

    progress = _Progress("verifying", 0, stderr, enabled=not args.quiet and stderr.isatty())

    def say(line: str, always: bool = False) -> None:
        if always or not args.quiet:
            progress.clear()
            stdout.write(line + "\n")
            stdout.flush()

    failures = findings = 0
    tensors = read = 0
    total = 0
    # Every header is validated before any tensor is read, so the progress bar knows the total.
    opened: List[Tuple[Shard, Optional["_cpp.File"], str]] = []
    for shard in checkpoint.shards:
        if checkpoint.index_path is not None and not os.path.exists(shard.path):
            opened.append((shard, None, f"no such file, but the index {checkpoint.index_path} names it"))
            continue
        try:
            file = _open(shard.path)
        except (SafetensorError, OSError) as e:
            opened.append((shard, None, _describe_error(e)))
            continue
        opened.append((shard, file, ""))
        total += file.size - file.data_offset

    progress.total = total
    scratch = _Scratch()
    for shard, file, error in opened:
        if file is None:
            failures += 1
            say(f"FAIL  {shard.path}: {error}", always=True)
            continue
        problems: List[str] = []
        notes: List[str] = []
        names = set(file.keys())
        if shard.names is not None:
            missing = [n for n in shard.names if n not in names]
            if missing:
                problems.append(
                    f"does not hold {_name_list(missing)}, which the index {checkpoint.index_path} assigns to it"
                )
            extra = sorted(names - set(shard.names))
            if extra:
                notes.append(f"note: holds {_name_list(extra)} that the index does not list")
        scanned = unscanned = 0
        for name, info in file.infos():
            code, shape = info[0], info[1]
            scan = np is not None and _is_float(code)
            if scan and DTYPES[code].bits % 8 == 0 and code not in types:
                scan = False
                unscanned += 1
            nan = inf = 0
            try:
                for view in _chunks(file, name, info, scratch):
                    read += len(view)
                    progress.update(read)
                    if scan:
                        n, i = _scan(np, types, code, view)
                        nan, inf = nan + n, inf + i
            except (SafetensorError, OSError) as e:
                problems.append(f"tensor {name!r}: {_describe_error(e)}")
                break
            tensors += 1
            scanned += scan
            if nan or inf:
                findings += 1
                notes.append(
                    f"tensor {name!r} ({code} {_shape_text(shape)}): "
                    f"{nan:,} NaN, {inf:,} Inf in {_numel(shape):,} values"
                )
        if problems:
            failures += 1
            for problem in problems:
                say(f"FAIL  {shard.path}: {problem}", always=True)
            for note in notes:
                say(f"      {note}", always=note.startswith("tensor "))
            continue
        status = "OK  "
        summary = f"{shard.path}: {_n(len(file), 'tensor')}, {format_size(file.size - file.data_offset)} read"
        if np is not None:
            with_nan = sum(1 for note in notes if note.startswith("tensor "))
            summary += f", {_n(scanned, 'float tensor')} scanned"
            if unscanned:
                summary += f", {unscanned} not (numpy has no type for them: pip install ml_dtypes)"
            if with_nan:
                status = "NaN "
                summary += f", {with_nan} with NaN/Inf"
        say(f"{status}  {summary}", always=status != "OK  ")
        for note in notes:
            say(f"      {note}", always=note.startswith("tensor "))
    progress.close()

    result = "OK" if not failures and not findings else "FAILED"
    parts = [_n(len(opened), "file"), _n(tensors, "tensor"), f"{format_size(read)} read"]
    if failures:
        parts.append(f"{failures} failed")
    if args.scan:
        parts.append(f"{_n(findings, 'tensor')} with NaN/Inf")
    say(f"verify {result}: " + ", ".join(parts), always=True)
    return EXIT_OK if result == "OK" else EXIT_FAILED


# -- diff --------------------------------------------------------------------------------------------------

class _Side:
    """One side of a diff: every tensor of a checkpoint by name, and its files' metadata merged."""

    def __init__(self, path: str) -> None:
        checkpoint = _resolve(path)
        self.path = path
        self.tensors: Dict[str, Tuple["_cpp.File", Info]] = {}
        where: Dict[str, str] = {}
        values: Dict[str, Set[str]] = {}
        for shard in checkpoint.shards:
            item = _open_shard(checkpoint, shard)
            for name, info in item.tensors:
                if name in self.tensors:
                    raise CliError(f"{path}: tensor {name!r} is in both {where[name]} and {shard.path}")
                self.tensors[name] = (item.file, info)
                where[name] = shard.path
            for key, value in (item.file.metadata() or {}).items():
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
        from .numpy import _unpack

        elements = _unpack(np.frombuffer(view, dtype=np.uint8), code, (len(view) * 8 // bits,))
        return elements.view(np.uint8), elements
    raw = np.frombuffer(view, dtype=f"<u{bits // 8}")
    if not _is_float(code) or dtype is None:
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
        self.has_values = _is_float(code) and code in types

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
        elif _is_float(self.code):
            text += " (install ml_dtypes for the max abs diff of this dtype)"
        return text


def cmd_diff(args: argparse.Namespace, stdout: IO[str], stderr: IO[str]) -> int:
    np = _numpy()
    from .numpy import _TYPES as types  # noqa: N811

    a, b = _Side(args.a), _Side(args.b)
    lines: List[str] = []
    compared = same_bytes = 0
    for name in sorted(a.tensors.keys() | b.tensors.keys()):
        if name not in b.tensors:
            code, shape = a.tensors[name][1][:2]
            lines.append(f"only in A: {name}  {code} {_shape_text(shape)}")
            continue
        if name not in a.tensors:
            code, shape = b.tensors[name][1][:2]
            lines.append(f"only in B: {name}  {code} {_shape_text(shape)}")
            continue
        (fa, ia), (fb, ib) = a.tensors[name], b.tensors[name]
        if ia[:2] != ib[:2]:
            lines.append(f"dtype/shape differ: {name}  {ia[0]} {_shape_text(ia[1])} -> {ib[0]} {_shape_text(ib[1])}")
            continue
        compared += 1
        values = _ValueDiff(np, types, ia[0])
        try:
            pieces_b = _chunks(fb, name, ib, _Scratch())
            for piece_a in _chunks(fa, name, ia, _Scratch()):
                values.add(piece_a, next(pieces_b))
        except (SafetensorError, OSError) as e:
            raise CliError(_describe_error(e)) from None
        if values.differing:
            lines.append(f"values differ: {name}  {ia[0]} {_shape_text(ia[1])}: {values.describe(_numel(ia[1]))}")
        else:
            same_bytes += ia[3] - ia[2]
    for key in sorted(a.metadata.keys() | b.metadata.keys()):
        va, vb = a.metadata.get(key), b.metadata.get(key)
        if vb is None:
            lines.append(f"metadata only in A: {_one_line(key)} = {_one_line(va, 80)!r}")
        elif va is None:
            lines.append(f"metadata only in B: {_one_line(key)} = {_one_line(vb, 80)!r}")
        elif va != vb:
            lines.append(f"metadata differs: {_one_line(key)}: {_one_line(va, 80)!r} -> {_one_line(vb, 80)!r}")
    stdout.write(f"A: {args.a}\nB: {args.b}\n")
    for line in lines:
        stdout.write(line + "\n")
    if lines:
        stdout.write(f"{_n(len(lines), 'difference')} ({_n(compared, 'tensor')} compared)\n")
        return EXIT_FAILED
    stdout.write(
        f"identical: {_n(compared, 'tensor')}, {same_bytes:,} bytes of tensor data, {_n(len(a.metadata), 'metadata entry')}\n"
    )
    return EXIT_OK


# -- convert -----------------------------------------------------------------------------------------------

_SHARD_RE_TEMPLATE = r"{stem}-\d{{5}}-of-\d{{5}}\.safetensors"


def _output_layout(output: str) -> Tuple[str, str]:
    """(directory, stem) of the files ``convert`` writes: ``OUT/model.safetensors`` -> (``OUT``, ``model``);
    an existing directory, or a path ending in a separator, gets ``model.safetensors`` inside it."""
    if os.path.isdir(output) or output.endswith(("/", os.sep)):
        return output, "model"
    directory, base = os.path.split(output)
    if not base.endswith(SAFETENSORS_SUFFIX) or base == SAFETENSORS_SUFFIX:
        raise CliError(f"{output}: the output must be a .safetensors file name or a directory")
    return directory, base[: -len(SAFETENSORS_SUFFIX)]


def _existing_outputs(directory: str, stem: str) -> List[str]:
    """Files of either layout (one file, or shards and an index) already written for ``stem``."""
    if not os.path.isdir(directory or "."):
        return []
    pattern = re.compile(_SHARD_RE_TEMPLATE.format(stem=re.escape(stem)))
    single, index = stem + SAFETENSORS_SUFFIX, stem + INDEX_SUFFIX
    return sorted(
        os.path.join(directory, e)
        for e in os.listdir(directory or ".")
        if e in (single, index) or pattern.fullmatch(e)
    )


def _parse_metadata(items: Sequence[str]) -> Dict[str, str]:
    out: Dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise CliError(f"--metadata {item!r}: expected KEY=VALUE")
        if key in out:
            raise CliError(f"--metadata: key {key!r} given twice")
        out[key] = value
    return out


def _torch_load_reason(error: BaseException) -> str:
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(error))
    marker = "WeightsUnpickler error:"
    if marker in text:
        text = text.split(marker, 1)[1]
        text = re.split(r"\.\s|\n\n", text.strip(), maxsplit=1)[0]
    return " ".join(text.split()) or type(error).__name__


def _load_state_dict(path: str) -> Tuple[Dict[str, Any], str]:
    """The state dict in a PyTorch checkpoint, and where it was found (``""``, ``"state_dict"``, ``"model"``).
    Memory-maps zip-format checkpoints, so tensors are read from disk as they are written out."""
    import torch

    try:
        loaded = torch.load(path, map_location="cpu", weights_only=True, mmap=zipfile.is_zipfile(path))
    except Exception as e:  # torch raises many types here: pickle, zip, runtime and OS errors
        raise CliError(f"{path}: cannot load with torch.load(weights_only=True): {_torch_load_reason(e)}") from None
    if not isinstance(loaded, dict):
        raise CliError(f"{path}: holds a {type(loaded).__name__}, not a state dict (a dict of tensors)")
    where = ""
    for key in ("state_dict", "model"):
        if isinstance(loaded.get(key), dict):
            loaded, where = loaded[key], key
            break
    bad = [k for k, v in loaded.items() if not isinstance(k, str) or not isinstance(v, torch.Tensor)]
    if bad:
        found = f' (in its "{where}" entry)' if where else ""
        details = ", ".join(f"{k!r} ({type(loaded[k]).__name__})" for k in bad[:5])
        more = f" and {len(bad) - 5} more" if len(bad) > 5 else ""
        raise CliError(
            f"{path}: the state dict{found} has entries that are not named tensors: {details}{more}; "
            'expected a state dict, or a dict with a "state_dict" or "model" entry holding one'
        )
    return dict(loaded), where


def _same_view(a: Any, b: Any) -> bool:
    return a.data_ptr() == b.data_ptr() and a.dtype == b.dtype and a.shape == b.shape and a.stride() == b.stride()


def _untie(state_dict: Dict[str, Any]) -> Tuple[Dict[str, Any], Dict[str, str], List[str]]:
    """Drops aliases of shared tensors the way ``save_model`` does. Returns the tensors to write, the
    ``{dropped: kept}`` records, and the names of tensors copied to stand alone.

    Only exact aliases (the same elements as the kept tensor) are dropped: a loader restores them from the
    record. Other tensors overlapping a kept one (a slice of it, say), or a group none of whose members
    covers its whole storage, are written as independent copies, so no data is lost."""
    from .torch import _find_shared_tensors, _remove_duplicate_names

    kept: Dict[str, Any] = dict(state_dict)
    ties: Dict[str, str] = {}
    copied: List[str] = []
    for group in _find_shared_tensors(state_dict):
        if len(group) < 2:
            continue
        members = {name: state_dict[name] for name in sorted(group)}
        try:
            removals = _remove_duplicate_names(members)
        except RuntimeError:  # no member covers the whole storage
            removals = {}
        anchor = next(iter(removals), None)
        for keep, dropped in removals.items():
            for name in dropped:
                if _same_view(members[name], members[keep]):
                    ties[name] = keep
                    del kept[name]
        remaining = [name for name in members if name not in ties]
        if anchor is None:
            anchor = remaining[0]
        for name in remaining:
            if name != anchor:
                kept[name] = members[name].clone()
                copied.append(name)
    return kept, ties, copied


def cmd_convert(args: argparse.Namespace, stdout: IO[str], stderr: IO[str]) -> int:
    if not os.path.exists(args.input):
        raise CliError(f"{args.input}: no such file")
    if os.path.isdir(args.input):
        raise CliError(f"{args.input}: is a directory; convert takes one PyTorch checkpoint file")
    directory, stem = _output_layout(args.output)
    max_shard = None
    if args.max_shard_size is not None:
        try:
            max_shard = parse_size(args.max_shard_size)
        except ValueError as e:
            raise CliError(f"--max-shard-size: {e}") from None
    user_metadata = _parse_metadata(args.metadata or [])
    existing = _existing_outputs(directory, stem)
    if existing and not args.force:
        raise CliError(f"{existing[0]}: already exists; pass --force to overwrite")
    try:
        import torch
    except ImportError:
        raise CliError("convert needs PyTorch: pip install torch") from None
    from .torch import _CODES, save_file

    state_dict, where = _load_state_dict(args.input)
    for name, tensor in state_dict.items():
        if tensor.layout != torch.strided:
            raise CliError(f"{args.input}: tensor {name!r} is sparse ({tensor.layout}); safetensors stores dense tensors")
        if tensor.dtype not in _CODES:
            raise CliError(f"{args.input}: tensor {name!r} has dtype {tensor.dtype}, which safetensors cannot store")
    tensors, ties, copied = _untie(state_dict)
    tensors = {name: tensor.contiguous() for name, tensor in tensors.items()}

    # transformers 4.x refuses a file whose metadata lacks "format"; tie records follow save_model
    # (an explicit --metadata value wins over a record of the same key).
    metadata = {"format": "pt", **user_metadata}
    for dropped, keep in ties.items():
        metadata.setdefault(dropped, keep)

    sizes = [(name, t.nelement() * t.element_size()) for name, t in tensors.items()]
    total = sum(n for _, n in sizes)
    groups = [[name for name, _ in sizes]] if max_shard is None else plan_shards(sizes, max_shard)
    if len(groups) == 1:
        targets = [os.path.join(directory, stem + SAFETENSORS_SUFFIX)]
    else:
        targets = [os.path.join(directory, f) for f in shard_file_names(stem, len(groups))]
    index_path = os.path.join(directory, stem + INDEX_SUFFIX) if len(groups) > 1 else None

    if directory:
        os.makedirs(directory, exist_ok=True)
    progress = _Progress("converting", total, stderr, enabled=not args.quiet and stderr.isatty())
    done = 0
    try:
        for target, names in zip(targets, groups):
            shard = {name: tensors[name] for name in names}
            nbytes = sum(t.nelement() * t.element_size() for t in shard.values())
            with _WriteWatcher(progress, done, nbytes):
                save_file(shard, target, metadata=metadata)
            done += nbytes
        if index_path is not None:
            weight_map = {name: os.path.basename(t) for t, names in zip(targets, groups) for name in names}
            write_index(index_path, total, weight_map)
    except (SafetensorError, OSError) as e:
        raise CliError(_describe_error(e)) from None
    finally:
        progress.close()

    written = set(targets) | ({index_path} if index_path else set())
    stale = [p for p in existing if p not in written]
    # The old index goes first, so no reader meets an index naming shards that are being removed.
    for path in sorted(stale, key=lambda p: not p.endswith(INDEX_SUFFIX)):
        os.unlink(path)

    if not args.quiet:
        source = f' ("{where}" entry)' if where else ""
        stdout.write(f"converted {args.input}{source}: {_n(len(tensors), 'tensor')}, {format_size(total)}\n")
        for target, names in zip(targets, groups):
            stdout.write(f"  wrote {target}: {_n(len(names), 'tensor')}\n")
        if index_path is not None:
            stdout.write(f"  wrote {index_path}\n")
        for dropped, keep in sorted(ties.items()):
            stdout.write(f"  shared tensor {dropped} is stored once, as {keep} (recorded in the metadata)\n")
        if copied:
            stdout.write(f"  overlapping tensors written as separate copies: {', '.join(sorted(copied))}\n")
        for path in stale:
            stdout.write(f"  removed stale {path}\n")
    return EXIT_OK


# -- the parser --------------------------------------------------------------------------------------------

_EPILOG = """\
exit status: 0 success; 1 verification failure, NaN/Inf found, or differences found;
2 usage or input error (missing file, not a safetensors file, existing output).
A checkpoint is a .safetensors file, a directory (its *.safetensors.index.json when it has
one, else every *.safetensors file in it), or an index file such as model.safetensors.index.json."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Inspect, verify, convert and compare safetensors checkpoints.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    from . import __version__

    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    commands.required = True

    p = commands.add_parser(
        "inspect",
        help="list tensors, parameter counts and metadata",
        description="Show each tensor (name, dtype, shape, size, data offsets), parameter counts by dtype, the "
        "total size of tensor data, and the metadata. For an index, each shard shows only the tensors the index "
        "assigns to it.",
    )
    p.add_argument("path", metavar="FILE|DIR|INDEX", help="a .safetensors file, a directory or an index file")
    p.add_argument("--json", action="store_true", help="print a JSON document instead of tables")
    p.set_defaults(run=cmd_inspect)

    p = commands.add_parser(
        "verify",
        help="validate headers and read every tensor",
        description="Validate every file (the header, then every tensor's bytes, read from disk) and, for an "
        "index, that each shard it names exists and holds the tensors assigned to it. Exit status 1 on any "
        "failure.",
    )
    p.add_argument("path", metavar="FILE|DIR|INDEX", help="a .safetensors file, a directory or an index file")
    p.add_argument("--scan", action="store_true", help="also count NaN and Inf values in float tensors (exit 1 if any)")
    p.add_argument("-q", "--quiet", action="store_true", help="print only failures, findings and the summary")
    p.set_defaults(run=cmd_verify)

    p = commands.add_parser(
        "convert",
        help="convert a PyTorch checkpoint (.bin/.pt/.pth) to safetensors",
        description="Convert a PyTorch checkpoint (a state dict, or a dict with a 'state_dict' or 'model' entry "
        "holding one) loaded with torch.load(weights_only=True). Shared (tied) tensors are stored once and "
        "recorded in the metadata as save_model does; the metadata also gets format=pt, which transformers "
        "4.x requires. With --max-shard-size, a checkpoint above the limit is written as "
        "STEM-0000i-of-0000N.safetensors shards plus STEM.safetensors.index.json.",
    )
    p.add_argument("input", metavar="INPUT", help="the PyTorch checkpoint file")
    p.add_argument(
        "output",
        metavar="OUTPUT",
        help="the .safetensors file to write (its name without .safetensors is the shard stem), or a directory "
        "(model.safetensors in it)",
    )
    p.add_argument(
        "--max-shard-size",
        metavar="SIZE",
        help="largest amount of tensor data per file, e.g. 5GB, 500MB, 2GiB (KB/MB/GB are powers of 1000, "
        "KiB/MiB/GiB powers of 1024); default: one file",
    )
    p.add_argument(
        "--metadata", metavar="KEY=VALUE", action="append", help="a metadata entry to store (repeatable)"
    )
    p.add_argument(
        "-f", "--force", action="store_true", help="overwrite existing output, removing stale shards of the same stem"
    )
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar and no summary")
    p.set_defaults(run=cmd_convert)

    p = commands.add_parser(
        "diff",
        help="compare two checkpoints",
        description="Compare two checkpoints: tensors only in one, different dtype or shape, different values "
        "(bytes; for floats also the largest absolute difference), and metadata (merged over each checkpoint's "
        "files). Exit status 0 when identical, 1 when different.",
    )
    p.add_argument("a", metavar="A", help="a .safetensors file, a directory or an index file")
    p.add_argument("b", metavar="B", help="a .safetensors file, a directory or an index file")
    p.set_defaults(run=cmd_diff)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Runs the tool on ``argv`` (default: the process arguments) and returns the exit status."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # --help, --version and usage errors
        return e.code if isinstance(e.code, int) else EXIT_USAGE
    stdout, stderr = sys.stdout, sys.stderr
    try:
        return args.run(args, stdout, stderr)
    except CliError as e:
        stderr.write(f"{PROG} {args.command}: error: {e}\n")
        return EXIT_USAGE
    except KeyboardInterrupt:
        stderr.write(f"{PROG} {args.command}: interrupted\n")
        return 130
    except BrokenPipeError:
        # The reader went away (`safetensors inspect ... | head`): stop quietly, as a killed pipe writer would.
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit
        except (OSError, ValueError):
            pass
        return 141


if __name__ == "__main__":
    sys.exit(main())
