"""What every command of the tool shares: exit codes, errors, reading tensors in bounded pieces, the progress
bar, and opening a checkpoint's shards (each checked against its index by the C++ ``ShardIndex.select``)."""

from __future__ import annotations

import ctypes
import os
import threading
import time
from typing import IO, Any, Iterator, List, Optional, Sequence, Tuple

from .. import _safetensors_cpp as _cpp
from .._core import DTYPES, Piece
from .._safetensors_cpp import SafetensorError
from .._checkpoint_paths import Checkpoint, CheckpointError, Shard, format_size, resolve

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2

PROG = "safetensors"

#: Tensors larger than this are read in row ranges of about this size, so memory stays bounded.
CHUNK_BYTES = 64 * 2**20


class CliError(Exception):
    """A usage or input error: printed as one line, exit status 2."""


# -- small helpers -----------------------------------------------------------------------------------------

def describe_error(error: BaseException) -> str:
    """One line for an exception from opening or reading a file; the message names the file."""
    if isinstance(error, OSError) and error.filename is not None and error.strerror:
        return f"{error.filename}: {error.strerror}"
    return " ".join(str(error).split())


def open_file(path: str) -> "_cpp.File":
    """Opens and validates the header of ``path``. Tensor bytes are read on demand with positional reads."""
    return _cpp.File(path, "pread")


def numel(shape: Sequence[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def count_of(count: int, noun: str) -> str:
    """``count_of(1, "file")`` -> ``"1 file"``, ``count_of(3, "metadata entry")`` -> ``"3 metadata entries"``."""
    if count == 1:
        return f"1 {noun}"
    plural = noun[:-1] + "ies" if noun.endswith("y") else noun + "s"
    return f"{count:,} {plural}"


def shape_text(shape: Sequence[int]) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"


def is_float(code: str) -> bool:
    """Floating-point values, real or complex (the dtype table's kind)."""
    return DTYPES[code].kind in ("float", "complex")


def one_line(value: str, limit: int = 200) -> str:
    text = value.replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r").replace("\t", "\\t")
    if len(text) > limit:
        return f"{text[:limit]}... ({len(value)} characters)"
    return text


def numpy_module() -> Any:
    try:
        import numpy
    except ImportError:
        raise CliError("this command needs numpy: pip install numpy ml_dtypes") from None
    return numpy


class Scratch:
    """A reusable read buffer: one allocation per size increase instead of one per tensor."""

    def __init__(self) -> None:
        self._buf = bytearray()
        self._addr = 0

    def get(self, nbytes: int) -> Tuple[int, memoryview]:
        if len(self._buf) < nbytes:
            self._buf = bytearray(nbytes)
            self._addr = ctypes.addressof(ctypes.c_char.from_buffer(self._buf))
        return self._addr, memoryview(self._buf)[:nbytes]


def chunks_of(file: "_cpp.File", name: str, piece: Piece, scratch: Scratch) -> Iterator[memoryview]:
    """The bytes of one tensor, read in pieces of about CHUNK_BYTES (whole rows of the first dimension; a
    tensor that cannot be split that way, or a sub-byte one, is read whole). Each piece is valid until the
    next one is read."""
    code, shape, begin, end, _ = piece
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
        plan = file.plan_slice(name, [slice(start, min(rows, start + step), 1)])
        addr, view = scratch.get(plan.nbytes)
        file.read_slice(name, plan, addr)
        yield view


class Progress:
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


class WriteWatcher:
    """While a native call writes a file (with the GIL released), advances a progress bar from this
    process's write count; where that count is unavailable the bar moves when the call returns."""

    def __init__(self, progress: Progress, base: int, nbytes: int) -> None:
        self._progress = progress
        self._base = base
        self._nbytes = nbytes
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def __enter__(self) -> "WriteWatcher":
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

def resolve_checkpoint(path: str) -> Checkpoint:
    try:
        return resolve(path)
    except CheckpointError as e:
        raise CliError(str(e)) from None
    except OSError as e:
        raise CliError(describe_error(e)) from None


class OpenShard:
    """A shard opened for reading, with the tensors the checkpoint takes from it (file order)."""

    def __init__(self, shard: Shard, file: "_cpp.File", tensors: List[Tuple[str, Piece]]) -> None:
        self.shard = shard
        self.file = file
        self.tensors = tensors


def open_shard(checkpoint: Checkpoint, shard: Shard) -> OpenShard:
    """Opens one shard; an index naming a missing shard, or a tensor the shard lacks, is a CliError."""
    if checkpoint.index_path is not None and not os.path.exists(shard.path):
        raise CliError(f"{shard.path}: no such file, but the index {checkpoint.index_path} names it")
    try:
        file = open_file(shard.path)
    except (SafetensorError, OSError) as e:
        raise CliError(describe_error(e)) from None
    try:
        names = assigned_names(checkpoint, shard, file)
    except SafetensorError as e:
        raise CliError(unassigned_text(checkpoint, e)) from None
    pieces = [(name, Piece(*info)) for name, info in file.infos()]
    if names is None:
        return OpenShard(shard, file, pieces)
    by_name = dict(pieces)
    return OpenShard(shard, file, [(name, by_name[name]) for name in names])


def assigned_names(checkpoint: Checkpoint, shard: Shard, file: "_cpp.File") -> Optional[List[str]]:
    """The tensors of ``file`` the checkpoint takes from it, in file order; None (all of them) without an
    index. For an index this is ``ShardIndex.select``, the one check that a shard holds what the index
    assigns: it raises SafetensorError (TensorNotFound, naming the shard and the tensor) when it does not."""
    if shard.position is None or checkpoint.index is None:
        return None
    return checkpoint.index.select(file, shard.position)


def unassigned_text(checkpoint: Checkpoint, error: BaseException) -> str:
    return f"{describe_error(error)}, which the index {checkpoint.index_path} assigns to it"


def name_list(names: Sequence[str], limit: int = 5) -> str:
    shown = ", ".join(repr(n) for n in names[:limit])
    more = len(names) - limit
    noun = "tensor" if len(names) == 1 else "tensors"
    return f"{noun} {shown}" + (f" and {more} more" if more > 0 else "")
