"""``safetensors verify``: every header validated, every tensor read from disk (optionally scanned for NaN/Inf),
and for an index every shard checked against it; each failing file is reported, not just the first."""

from __future__ import annotations

import argparse
import os
from typing import IO, Any, Dict, List, Optional, Tuple

from .. import _safetensors_cpp as _cpp
from .._core import DTYPES, Piece
from .._safetensors_cpp import SafetensorError
from .._checkpoint_paths import CheckpointError, IndexFormatError, Shard, format_size, resolve
from .common import (
    EXIT_FAILED,
    EXIT_OK,
    CliError,
    assigned_names,
    chunks_of,
    describe_error,
    is_float,
    count_of,
    name_list,
    numel,
    numpy_module,
    open_file,
    Progress,
    Scratch,
    shape_text,
    unassigned_text,
)

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
        np = numpy_module()
        from .._numpy_bridge import TYPES as types  # noqa: N811 - numpy's code -> dtype table
    try:
        checkpoint = resolve(args.path)
    except IndexFormatError as e:
        stdout.write(f"FAIL  {e}\n")
        return EXIT_FAILED
    except CheckpointError as e:
        raise CliError(str(e)) from None
    except OSError as e:
        raise CliError(describe_error(e)) from None

    progress = Progress("verifying", 0, stderr, enabled=not args.quiet and stderr.isatty())

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
            file = open_file(shard.path)
        except (SafetensorError, OSError) as e:
            opened.append((shard, None, describe_error(e)))
            continue
        opened.append((shard, file, ""))
        total += file.size - file.data_offset

    progress.total = total
    scratch = Scratch()
    for shard, file, error in opened:
        if file is None:
            failures += 1
            say(f"FAIL  {shard.path}: {error}", always=True)
            continue
        problems: List[str] = []
        notes: List[str] = []
        try:
            assigned = assigned_names(checkpoint, shard, file)
        except SafetensorError as e:
            problems.append(unassigned_text(checkpoint, e))
            assigned = shard.names
        if assigned is not None:
            extra = sorted(set(file.keys()) - set(assigned))
            if extra:
                notes.append(f"note: holds {name_list(extra)} that the index does not list")
        scanned = unscanned = 0
        for name, info in file.infos():
            piece = Piece(*info)
            code, shape = piece.code, piece.shape
            scan = np is not None and is_float(code)
            if scan and DTYPES[code].bits % 8 == 0 and code not in types:
                scan = False
                unscanned += 1
            nan = inf = 0
            try:
                for view in chunks_of(file, name, piece, scratch):
                    read += len(view)
                    progress.update(read)
                    if scan:
                        n, i = _scan(np, types, code, view)
                        nan, inf = nan + n, inf + i
            except (SafetensorError, OSError) as e:
                problems.append(f"tensor {name!r}: {describe_error(e)}")
                break
            tensors += 1
            scanned += scan
            if nan or inf:
                findings += 1
                notes.append(
                    f"tensor {name!r} ({code} {shape_text(shape)}): "
                    f"{nan:,} NaN, {inf:,} Inf in {numel(shape):,} values"
                )
        if problems:
            failures += 1
            for problem in problems:
                say(f"FAIL  {shard.path}: {problem}", always=True)
            for note in notes:
                say(f"      {note}", always=note.startswith("tensor "))
            continue
        status = "OK  "
        summary = f"{shard.path}: {count_of(len(file), 'tensor')}, {format_size(file.size - file.data_offset)} read"
        if np is not None:
            with_nan = sum(1 for note in notes if note.startswith("tensor "))
            summary += f", {count_of(scanned, 'float tensor')} scanned"
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
    parts = [count_of(len(opened), "file"), count_of(tensors, "tensor"), f"{format_size(read)} read"]
    if failures:
        parts.append(f"{failures} failed")
    if args.scan:
        parts.append(f"{count_of(findings, 'tensor')} with NaN/Inf")
    say(f"verify {result}: " + ", ".join(parts), always=True)
    return EXIT_OK if result == "OK" else EXIT_FAILED
