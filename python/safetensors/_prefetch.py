"""``safe_open.prefetch``: tensors loading in the background, handed out once each (the reference's 0.9 API).

The reference loads to CUDA only; this loads to every device torch knows with the same semantics: ``cpu``
(tensors in memory of their own), ``cuda``, ``npu``, ``xpu``, any PrivateUse1 backend, and ``meta``.

A plan names tensors, whole, as rows ``[start, stop)`` of the first dimension (a contiguous byte range of the
file) or as a box (a tuple of slices, one per leading dimension: strided runs, read by the library's slice
reader on a thread of their own). Every planned piece is validated before anything is read or allocated
(``_plan.plan_pieces``, which the distributed loader's plans go through too). Then the C++ loading engine (``_engine.py`` over
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
import threading
from typing import Any, Deque, Dict, List, Optional, Tuple

from ._core import Piece
from ._plan import read_box
from ._safetensors_cpp import SafetensorError

__all__ = ["PrefetchLoader", "TensorStream"]

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
        self._threads: List[threading.Thread] = []
        self._direct: Any = None
        from ._torch_types import allocate, byte_jobs, empty

        if device.type == "meta":
            for name, piece in pieces:
                self._land([name], [empty(piece.code, piece.shape, device)])
            return
        # Every destination is allocated now (only the planned bytes); the engine fills them in the background.
        tensors, runs = allocate(pieces, device, file)
        for t, (name, piece) in zip(tensors, pieces):
            if piece.end == piece.begin:
                self._land([name], [t])
        # Boxes of inner dimensions: strided runs, read by the library's slice reader on a thread of their own.
        boxes = [(name, piece, t) for t, (name, piece) in zip(tensors, pieces) if piece.box is not None
                 and piece.end > piece.begin]
        work: List[Tuple[Any, tuple]] = []
        if boxes:
            work.append((self._load_boxes, (boxes, device)))
        if device.type == "cpu":
            from ._engine import DirectLoad

            self._direct = DirectLoad(self._file, [(pieces[i][0], tensors[i].data_ptr(), pieces[i][1].begin,
                                                    pieces[i][1].end) for i in runs], threads)
            work.append((self._load_cpu, ([(pieces[i][0], tensors[i]) for i in runs],)))
        elif runs:
            work.append((self._load_device, ([(pieces[i][0], tensors[i]) for i in runs],
                                              byte_jobs(tensors, pieces, runs), device)))
        for target, args in work:
            thread = threading.Thread(target=target, args=args, daemon=True, name="safetensors-prefetch")
            thread.start()
            self._threads.append(thread)

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

    def _load_boxes(self, boxes: List[Tuple[str, Piece, Any]], device: Any) -> None:
        import torch

        try:
            for name, piece, tensor in boxes:
                if self._stop.is_set():
                    return
                host = tensor if device.type == "cpu" else torch.empty_like(tensor, device="cpu")
                read_box(self._file, name, piece.box, host.data_ptr())
                if host is not tensor:
                    tensor.copy_(host)  # from pageable memory: complete when copy_ returns
                self._land([name], [tensor])
        except BaseException as e:  # delivered to whoever waits for these tensors
            if not self._stop.is_set():
                self._fail_rest(e)

    def _load_device(self, runs: List[Tuple[str, Any]], jobs: List[Tuple[Any, int, int]], device: Any) -> None:
        from . import _engine

        # Through the engine's slabs; a tensor lands once its copies completed (ready on any stream).
        def landed(job: int) -> None:
            self._land([runs[job][0]], [runs[job][1]])

        try:
            _engine.stream_to_device(self._file, jobs, device, on_piece=landed, stop=self._stop,
                                     names=[name for name, _ in runs])
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
            while True:
                # Checked again after every wait: another thread may have taken it meanwhile.
                if name in self._taken:
                    raise SafetensorError(
                        f"tensor {name} already delivered (prefetch hands each tensor out once, via take or "
                        "iteration)"
                    )
                if name in self._ready or name in self._failed:
                    return self._hand_out(name)
                self._lock.wait()
                self._check_open()

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
        for thread in self._threads:
            thread.join()

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
