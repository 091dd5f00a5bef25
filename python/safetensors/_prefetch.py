"""``safe_open.prefetch``: tensors loading in the background, handed out once each (the reference's 0.9 API).

The reference loads to CUDA only; this loads to every device torch knows with the same semantics: ``cpu``
(tensors in memory of their own), ``cuda``, ``npu``, ``xpu``, any PrivateUse1 backend, and ``meta``.

A plan names tensors, whole or as rows ``[start, stop)`` of the first dimension (a contiguous byte range of
the file). Every planned piece is validated before anything is read or allocated (``plan_pieces``, which the
distributed loader's plans go through too). Then the C++ loading engine (``_engine.py`` over
include/safetensors/engine.h) fills them:

- to the CPU, its ``threads`` reader threads write each piece straight into a fresh tensor (positional reads,
  no staging copy), and a piece lands as soon as its bytes are in;
- to an accelerator, the readers fill page-locked slabs of the process-wide, bounded slab pool and one
  background thread issues the non-blocking device copies out of them; a slab is reused only once its copy
  completed, and a tensor lands once all of its copies completed (so it is ready on any stream).

Each piece is its own allocation: it is freed once taken and dropped; pieces not taken are held until
``close``. The loader keeps the file open (its own reference), so it outlives the ``safe_open`` handle.
"""

from __future__ import annotations

import collections
import operator
import threading
from typing import Any, Deque, Dict, List, Mapping, Optional, Sequence, Tuple

from . import _safetensors_cpp as _cpp
from ._safetensors_cpp import SafetensorError

__all__ = ["Piece", "PrefetchLoader", "TensorStream", "checked_plan", "plan_pieces"]

#: A piece: a tensor's byte range in a load plan (engine.h's Piece) -- the whole tensor, or rows [start, stop)
#: of its first dimension -- as (code, shape, begin, end): the shape of what it holds, data-buffer offsets.
Piece = Tuple[str, Tuple[int, ...], int, int]


def checked_plan(plan: Any) -> Dict[str, Optional[slice]]:
    """``plan`` (``{name: None | slice}``) as a dict, its keys and values checked: the one set of texts for
    every plan (prefetch, the distributed loader)."""
    if not isinstance(plan, Mapping):
        raise SafetensorError(f"prefetch plan must be a dict of tensor names to None or a slice, got "
                              f"{type(plan).__name__}")
    chosen: Dict[str, Optional[slice]] = {}
    for name, rows in plan.items():
        if not isinstance(name, str):
            raise SafetensorError("prefetch plan keys must be tensor names")
        if rows is not None and not isinstance(rows, slice):
            raise SafetensorError(f"prefetch plan values must be None or a slice, got {type(rows).__name__}")
        chosen[name] = rows
    return chosen


def plan_pieces(file: Any, plan: Optional[Mapping[str, Optional[slice]]], *, names: Optional[Sequence[str]] = None,
                empty_ok: bool = False) -> List[Tuple[str, Piece]]:
    """The pieces ``plan`` names in ``file`` (a ``_safetensors_cpp.File``), in file order, as torch can hold
    them; every error of the plan is raised here, before any I/O.

    ``plan``: None takes every tensor of ``names`` (default: every tensor of the file) whole; else
    ``{name: None | slice}``, a slice taking rows ``[start, stop)`` of the first dimension (step 1; negative
    bounds count from the end; never clamped). A plan that selects nothing is refused unless ``empty_ok``."""
    from ._torch_types import torch_dtype, torch_shape

    if plan is None:
        chosen: Dict[str, Optional[slice]] = dict.fromkeys(file.offset_keys() if names is None else names)
    else:
        chosen = checked_plan(plan)
        for name in chosen:
            if name not in file:
                file.info(name)  # the reference's "File does not contain tensor NAME"
        if not chosen and not empty_ok:
            raise SafetensorError("prefetch plan selects no tensors")
    pieces = []
    for name, (code, shape, begin, end) in file.infos():
        if name not in chosen:
            continue
        torch_dtype(code)  # a dtype torch lacks (F6) fails here
        rows = chosen[name]
        if rows is not None:
            begin, end, shape = _rows(file, name, shape, rows)
        torch_shape(code, shape)  # so do packed F4 rows torch cannot hold
        pieces.append((name, (code, shape, begin, end)))
    return pieces


def _rows(file: Any, name: str, shape: Tuple[int, ...], rows: slice) -> Tuple[int, int, Tuple[int, ...]]:
    """The data-buffer range and the shape of rows ``rows`` of tensor ``name``."""
    if rows.step is not None and rows.step != 1:
        if rows.step == 0:
            raise SafetensorError(f"invalid prefetch plan slice for {name}: slice step cannot be zero")
        raise SafetensorError(f"prefetch plan slices must have step 1, got {rows.step} (tensor {name})")
    if not shape:
        raise SafetensorError(f"cannot slice rows of the 0-d tensor {name}")
    count = shape[0]
    start = 0 if rows.start is None else _bound(rows.start, name)
    stop = count if rows.stop is None else _bound(rows.stop, name)
    # A plan is explicit: negative bounds count from the end, nothing is clamped.
    start = start + count if start < 0 else start
    stop = stop + count if stop < 0 else stop
    if not 0 <= start <= stop <= count:
        raise SafetensorError(
            f"prefetch plan slice bounds for {name} are out of range (0..{count}): "
            f"[{rows.start}:{rows.stop}] gives rows {start}..{stop}"
        )
    # The rows are one contiguous run of bytes (the engine's row_piece, which also refuses packed rows that do
    # not fall on byte boundaries).
    begin, end = _cpp.row_piece(file, name, start, stop)
    return begin, end, (stop - start,) + tuple(shape[1:])


def _bound(value: Any, name: str) -> int:
    try:
        return operator.index(value)
    except TypeError:
        raise SafetensorError(f"invalid prefetch plan slice for {name}: bounds must be integers") from None


class PrefetchLoader:
    """The tensors of one file loading in the background, returned by ``safe_open.prefetch``. Each tensor is
    handed out once, by ``take`` or by iterating. Thread-safe; a context manager that closes on exit."""

    def __init__(self, file: Any, pieces: List[Tuple[str, Piece]], device: Any, threads: int) -> None:
        self._file = file  # keeps the file open: the loader outlives the handle
        self._order = [name for name, _ in pieces]
        self._pieces = dict(pieces)
        self._lock = threading.Condition()
        self._ready: Dict[str, Any] = {}  # landed, not taken: name -> tensor
        self._failed: Dict[str, BaseException] = {}
        self._landed: Deque[str] = collections.deque()  # landing order, for iteration
        self._taken: set = set()
        self._closed = False
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._direct: Any = None
        from ._torch_types import empty

        if device.type == "meta":
            for name, (code, shape, _, _) in pieces:
                self._land([name], [empty(code, shape, device)])
            return
        # Every destination is allocated now (only the planned bytes); the engine fills them in the background.
        tensors = [_destination(piece, device, file) for _, piece in pieces]
        if device.type == "cpu":
            from ._engine import DirectLoad

            jobs = [(name, t.data_ptr(), piece[2], piece[3]) for t, (name, piece) in zip(tensors, pieces)
                    if piece[3] > piece[2]]
            for t, (name, piece) in zip(tensors, pieces):
                if piece[3] == piece[2]:
                    self._land([name], [t])
            self._direct = DirectLoad(self._file, jobs, threads)
            target, args = self._load_cpu, ([(n, t) for t, (n, p) in zip(tensors, pieces) if p[3] > p[2]],)
        else:
            target, args = self._load_device, (pieces, tensors, device)
        self._thread = threading.Thread(target=target, args=args, daemon=True, name="safetensors-prefetch")
        self._thread.start()

    # -- background work ------------------------------------------------------------------------------------
    def _land(self, names: List[str], tensors: List[Any], error: Optional[BaseException] = None) -> None:
        with self._lock:
            if self._closed:
                return
            for i, name in enumerate(names):
                if error is not None:
                    self._failed[name] = error
                else:
                    self._ready[name] = tensors[i]
                self._landed.append(name)
            self._lock.notify_all()

    def _fail_rest(self, error: BaseException) -> None:
        """Every piece not landed yet gets the readers' error (it stops the whole load)."""
        with self._lock:
            rest = [n for n in self._order if n not in self._ready and n not in self._failed and n not in self._taken]
        self._land(rest, [], error)

    def _load_cpu(self, jobs: List[Tuple[str, Any]]) -> None:
        # Reader threads write straight into each tensor; a finished job lands its tensor.
        try:
            while True:
                done = self._direct.next_done()
                if done is None:
                    return
                name, tensor = jobs[done]
                self._land([name], [tensor])
        except BaseException as e:  # delivered to whoever waits for these tensors
            if not self._stop.is_set():
                self._fail_rest(e)
        finally:
            self._direct.close()

    def _load_device(self, pieces: List[Tuple[str, Piece]], tensors: List[Any], device: Any) -> None:
        import torch

        from . import _engine

        # Through the engine's slabs; a tensor lands once its copies completed (ready on any stream).
        planned = [(i, t, piece) for i, (t, (_, piece)) in enumerate(zip(tensors, pieces))]
        for i, t, piece in planned:
            if piece[3] == piece[2]:
                self._land([pieces[i][0]], [t])
        moving = [(i, t, piece) for i, t, piece in planned if piece[3] > piece[2]]
        jobs = [(t.reshape(-1).view(torch.uint8), piece[2], piece[3]) for _, t, piece in moving]

        def landed(job: int) -> None:
            i = moving[job][0]
            self._land([pieces[i][0]], [tensors[i]])

        try:
            _engine.stream_to_device(self._file, jobs, device, on_piece=landed, stop=self._stop,
                                     names=[pieces[i][0] for i, _, _ in moving])
        except BaseException as e:
            if not self._stop.is_set():
                self._fail_rest(e)

    # -- the API --------------------------------------------------------------------------------------------
    def names(self) -> List[str]:
        """The names this loader hands out, in file order."""
        return list(self._order)

    def __len__(self) -> int:
        return len(self._order)

    def take(self, name: str) -> Any:
        """``name``'s tensor, waiting until its bytes landed. Each tensor is handed out once."""
        with self._lock:
            self._check_open()
            if name not in self._pieces:
                raise SafetensorError(f"{name} is not in the prefetch plan")
            if name in self._taken:
                raise SafetensorError(
                    f"tensor {name} already delivered (prefetch hands each tensor out once, via take or iteration)"
                )
            while name not in self._ready and name not in self._failed:
                self._lock.wait()
                self._check_open()
            return self._hand_out(name)

    def __iter__(self) -> "TensorStream":
        """``(name, tensor)`` pairs as their bytes land (unspecified order); tensors already taken are skipped."""
        return TensorStream(self)

    def _next_landed(self) -> Optional[Tuple[str, Any]]:
        """The next landed tensor not taken yet, waiting for one; None once every tensor has been handed out."""
        with self._lock:
            self._check_open()
            while True:
                while self._landed and self._landed[0] in self._taken:
                    self._landed.popleft()
                if self._landed:
                    name = self._landed.popleft()
                    return name, self._hand_out(name)
                if len(self._taken) == len(self._order):
                    return None
                self._lock.wait()
                self._check_open()

    def close(self) -> None:
        """Stops the background load and releases every tensor not taken yet; tensors already handed out keep
        their memory."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._stop.set()
            self._ready.clear()
            self._failed.clear()
            self._landed.clear()
            self._lock.notify_all()
        if self._direct is not None:
            self._direct.cancel()
        if self._thread is not None:
            self._thread.join()

    def __enter__(self) -> "PrefetchLoader":
        return self

    def __exit__(self, exc_type: Any, exc_value: Any, traceback: Any) -> None:
        self.close()

    def __del__(self) -> None:
        # Without close(), readers still stop at the next piece; nothing waits for them here.
        stop = getattr(self, "_stop", None)
        if stop is not None:
            stop.set()

    # -- helpers (the lock held) -----------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise SafetensorError("prefetch loader closed")

    def _hand_out(self, name: str) -> Any:
        self._taken.add(name)
        error = self._failed.pop(name, None)
        if error is not None:
            raise error
        return self._ready.pop(name)


class TensorStream:
    """Iterator over a :class:`PrefetchLoader`: ``(name, tensor)`` pairs in landing order, each tensor
    delivered once."""

    __slots__ = ("_loader",)

    def __init__(self, loader: PrefetchLoader) -> None:
        self._loader = loader

    def __iter__(self) -> "TensorStream":
        return self

    def __next__(self) -> Tuple[str, Any]:
        item = self._loader._next_landed()
        if item is None:
            raise StopIteration
        return item


def _destination(piece: Piece, device: Any, file: Any) -> Any:
    """A new tensor for ``piece`` on ``device``; on the CPU from a file read with O_DIRECT, placed where the file's
    direct reads land in it without a bounce (File.destination)."""
    from ._torch_types import empty, torch_dtype, torch_shape

    code, shape, begin, end = piece
    if device.type == "cpu" and file.backend == "direct" and end > begin:
        import torch

        raw = torch.from_dlpack(file.destination(begin, end - begin))
        return raw.view(torch_dtype(code)).reshape(torch_shape(code, shape))
    return empty(code, shape, device)
