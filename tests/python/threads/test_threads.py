"""Every shared object under real parallel use (README "Threads"): 8 threads released together by a barrier,
with a switch interval of a microsecond (so that on an interpreter with a GIL, threads interleave between
almost every bytecode), running hundreds of mixed operations on one shared ``safe_open`` handle, on private
handles, on saves, on a shared ``PrefetchLoader`` and through ``__exit__`` of a handle that others are reading.

Every result is compared with the bytes it must have. Each thread draws its operations from a generator
seeded by its index, so a failing run names an operation that can be replayed; no assertion depends on
timing (where the interleaving decides which of two outcomes a call gets, both are named and checked).

On a free-threaded interpreter (scripts/test.d/55-free-threaded.sh, 3.14t with PYTHON_GIL=0) the threads run
in parallel; there SAFETENSORS_STRESS_ROUNDS repeats every test (the normal suite runs each once).
"""

from __future__ import annotations

import gc
import os
import random
import sys
import threading
from typing import Any, Callable, Dict, List

import numpy as np
import pytest

from safetensors import SafetensorError, TensorSpec, safe_open, serialize
from safetensors.numpy import load, save, save_file

THREADS = 8
ROUNDS = int(os.environ.get("SAFETENSORS_STRESS_ROUNDS", "1"))
OPS = 40  # per thread and round: 8 x 40 = 320 operations a round
METADATA = {"format": "np", "stress": "threads"}
CLOSED = "File is closed"
DTYPES = [np.float32, np.float16, np.float64, np.int64, np.int32, np.int8, np.uint8, np.bool_]

try:  # torch is optional here (prefetch needs it); a free-threaded interpreter may have no torch build
    import torch

    NO_TORCH = ""
except ImportError as e:
    torch = None
    NO_TORCH = f"torch is not installed for this Python ({e}): prefetch and framework='pt' are not stressed"
needs_torch = pytest.mark.skipif(torch is None, reason=NO_TORCH)


@pytest.fixture(autouse=True)
def _fast_switching():
    """A microsecond between thread switches (interpreters with a GIL), restored after."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(before)


def make_tensors(seed: int, count: int = 24) -> Dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = {}
    for i in range(count):
        dtype = DTYPES[i % len(DTYPES)]
        shape = (int(rng.integers(1, 9)), int(rng.integers(1, 33)))
        if dtype is np.bool_:
            out[f"t{i:02d}"] = rng.integers(0, 2, size=shape).astype(np.bool_)
        elif np.issubdtype(dtype, np.integer):
            out[f"t{i:02d}"] = rng.integers(np.iinfo(dtype).min, np.iinfo(dtype).max, size=shape, dtype=dtype,
                                             endpoint=True)
        else:
            out[f"t{i:02d}"] = rng.standard_normal(shape).astype(dtype)
    return out


def same(got: Any, want: np.ndarray) -> None:
    """``got`` (a numpy array or a torch tensor) has exactly ``want``'s dtype, shape and bytes."""
    if torch is not None and isinstance(got, torch.Tensor):
        got = got.numpy()
    assert got.dtype == want.dtype and got.shape == want.shape, (got.dtype, got.shape, want.dtype, want.shape)
    assert np.ascontiguousarray(got).tobytes() == np.ascontiguousarray(want).tobytes()


def run_threads(work: Callable[[int, threading.Barrier], None]) -> None:
    """Runs work(index, barrier) on THREADS threads that start together; re-raises the first failure."""
    barrier = threading.Barrier(THREADS)
    errors: List[BaseException] = []

    def body(i: int) -> None:
        try:
            work(i, barrier)
        except BaseException as e:  # noqa: BLE001 -- reported below with the thread's index
            errors.append(e)
            barrier.abort()

    threads = [threading.Thread(target=body, args=(i,), name=f"stress-{i}") for i in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise AssertionError(f"{len(errors)} of {THREADS} stress threads failed; the first:") from errors[0]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    tensors = make_tensors(1234)
    path = tmp_path_factory.mktemp("threads") / "shared.safetensors"
    save_file(tensors, str(path), metadata=METADATA)
    return path, tensors


def random_index(rng: random.Random, shape) -> tuple:
    """A basic index expression over a 2-d tensor: slices with steps, an integer, or an Ellipsis."""
    rows, cols = shape
    kind = rng.randrange(4)
    a = rng.randrange(rows)
    b = rng.randrange(a, rows + 1)
    c = rng.randrange(cols)
    d = rng.randrange(c, cols + 1)
    if kind == 0:
        return (slice(a, b),)
    if kind == 1:
        return (slice(a, b), slice(c, d, rng.randrange(1, 3)))
    if kind == 2:
        return (a, slice(c, d))
    return (Ellipsis, slice(c, d))


def mixed_operation(rng: random.Random, shared: safe_open, path, tensors, framework: str, tmp, tid: int,
                    step: int) -> None:
    """One operation drawn by ``rng``, its result checked against ``tensors``."""
    names = sorted(tensors)
    name = rng.choice(names)
    op = rng.randrange(11 if framework == "pt" else 10)
    if op == 0:
        same(shared.get_tensor(name), tensors[name])
    elif op == 1:
        got = shared.get_tensors()
        assert sorted(got) == names
        for n in names:
            same(got[n], tensors[n])
    elif op == 2:
        index = random_index(rng, tensors[name].shape)
        same(shared.get_slice(name)[index], tensors[name][index])
    elif op == 3:
        sl = shared.get_slice(name)
        assert sl.get_shape() == list(tensors[name].shape) and len(sl) == tensors[name].shape[0]
    elif op == 4:
        assert shared.keys() == names
    elif op == 5:
        assert shared.metadata() == METADATA
    elif op == 6:
        meta = shared.get_tensor_meta(name)
        assert meta.shape == list(tensors[name].shape)
        begin, end = meta.data_offsets
        assert end - begin == tensors[name].nbytes
    elif op == 7:  # a private handle, opened and closed by this thread alone
        backend = rng.choice(["mmap", "pread"])
        with safe_open(path, framework, backend=backend) as own:
            same(own.get_tensor(name), tensors[name])
            index = random_index(rng, tensors[name].shape)
            same(own.get_slice(name)[index], tensors[name][index])
    elif op == 8:  # save_file of a private dict, read back
        mine = make_tensors(rng.randrange(1 << 30), count=rng.randrange(1, 6))
        out = tmp / f"save-{tid}-{step}.safetensors"
        save_file(mine, str(out), metadata={"thread": str(tid)})
        with safe_open(out, "np") as back:
            assert back.metadata() == {"thread": str(tid)}
            for n, want in mine.items():
                same(back.get_tensor(n), want)
        data = out.read_bytes()
        out.unlink()
        # serialize of the same arrays (raw memory): the same bytes as the file.
        specs = {n: TensorSpec(dtype=_TORCH_NAMES[a.dtype], shape=list(a.shape), data_ptr=a.ctypes.data,
                               data_len=a.nbytes) for n, a in mine.items()}
        assert serialize(specs, metadata={"thread": str(tid)}) == data
    elif op == 9:  # bytes in memory: save to bytes and load back
        mine = make_tensors(rng.randrange(1 << 30), count=rng.randrange(1, 4))
        got = load(save(mine))
        assert sorted(got) == sorted(mine)
        for n, want in mine.items():
            same(got[n], want)
    else:  # a prefetch from the shared handle (torch): each planned tensor taken once
        subset = rng.sample(names, rng.randrange(1, 6))
        with shared.prefetch({n: None for n in subset}) as loader:
            for n in rng.sample(subset, len(subset)):
                same(loader.take(n), tensors[n])


_TORCH_NAMES = {np.dtype(t): np.dtype(t).name for t in DTYPES}
_TORCH_NAMES[np.dtype(np.bool_)] = "bool"


@pytest.mark.parametrize("framework", ["np", pytest.param("pt", marks=needs_torch)])
@pytest.mark.parametrize("round_", range(ROUNDS))
def test_mixed_operations_on_shared_and_private_handles(model, tmp_path, framework, round_):
    path, tensors = model
    with safe_open(path, framework) as shared:

        def work(tid: int, barrier: threading.Barrier) -> None:
            rng = random.Random(1000 * round_ + tid)
            barrier.wait()
            for step in range(OPS):
                mixed_operation(rng, shared, path, tensors, framework, tmp_path, tid, step)

        run_threads(work)


@needs_torch
@pytest.mark.parametrize("round_", range(ROUNDS))
def test_shared_prefetch_loader_hands_each_tensor_out_once(tmp_path, round_):
    """Several threads take from and iterate one loader: every tensor is handed out exactly once, to exactly
    one thread, with its bytes; a second take of a name raises "already delivered"."""
    tensors = make_tensors(77 + round_, count=96)
    path = tmp_path / "prefetch.safetensors"
    save_file(tensors, str(path))
    names = sorted(tensors)
    got: List[Dict[str, Any]] = [{} for _ in range(THREADS)]
    refused: List[List[str]] = [[] for _ in range(THREADS)]
    with safe_open(path, "pt") as f, f.prefetch() as loader:

        def work(tid: int, barrier: threading.Barrier) -> None:
            rng = random.Random(round_ * 100 + tid)
            stream = iter(loader)
            barrier.wait()
            while True:
                if rng.random() < 0.5:
                    name = rng.choice(names)
                    try:
                        got[tid][name] = loader.take(name)
                    except SafetensorError as e:
                        assert "already delivered" in str(e), e
                        refused[tid].append(name)
                else:
                    try:
                        name, tensor = next(stream)
                    except StopIteration:
                        return
                    assert name not in got[tid]
                    got[tid][name] = tensor

        run_threads(work)
    handed = [name for per_thread in got for name in per_thread]
    assert sorted(handed) == names, "each tensor is handed out exactly once"
    for per_thread in got:
        for name, tensor in per_thread.items():
            same(tensor, tensors[name])
    assert all(name in handed for per_thread in refused for name in per_thread)


@needs_torch
@pytest.mark.parametrize("round_", range(ROUNDS))
def test_threads_taking_the_same_tensors_get_each_once(tmp_path, round_):
    """Every thread takes every tensor, in the same order, at once: for each name exactly one take returns it
    (with its bytes) and every other raises "already delivered". Eight threads meet on each name, so a take
    whose check and hand-out are not one step (a second thread between them) hands a tensor out twice or
    fails on the one already handed out, and a take that waits for a tensor another thread then takes must
    wake to "already delivered" (checking only for a landing, it waited forever: 3.11, switch interval 1 us)."""
    tensors = make_tensors(91 + round_, count=512)
    path = tmp_path / "race.safetensors"
    save_file(tensors, str(path))
    names = sorted(tensors)
    got: List[Dict[str, Any]] = [{} for _ in range(THREADS)]
    refused = [0] * THREADS
    with safe_open(path, "pt") as f, f.prefetch() as loader:

        def work(tid: int, barrier: threading.Barrier) -> None:
            barrier.wait()
            for name in names:
                try:
                    got[tid][name] = loader.take(name)
                except SafetensorError as e:
                    assert "already delivered" in str(e), e
                    refused[tid] += 1

        run_threads(work)
    handed = sorted(name for per_thread in got for name in per_thread)
    assert handed == names, "each tensor is handed out exactly once"
    assert sum(refused) == (THREADS - 1) * len(names)
    for per_thread in got:
        for name, tensor in per_thread.items():
            same(tensor, tensors[name])


@pytest.mark.parametrize("framework", ["np", pytest.param("pt", marks=needs_torch)])
@pytest.mark.parametrize("round_", range(ROUNDS))
def test_exit_while_other_threads_read(model, framework, round_):
    """One thread closes the shared handle while seven read from it: each call before or across the close
    either returns the right bytes or raises SafetensorError "File is closed"; every call after it raises
    that; tensors handed out before stay valid (the mapping is not freed under them)."""
    path, tensors = model
    names = sorted(tensors)
    shared = safe_open(path, framework)
    closed = threading.Event()
    kept: List[List[tuple]] = [[] for _ in range(THREADS)]

    def work(tid: int, barrier: threading.Barrier) -> None:
        rng = random.Random(5000 + 100 * round_ + tid)
        barrier.wait()
        if tid == 0:
            for _ in range(rng.randrange(1, 30)):  # a few reads of its own, then the close
                name = rng.choice(names)
                same(shared.get_tensor(name), tensors[name])
            shared.__exit__(None, None, None)
            closed.set()
        else:
            for step in range(OPS * 2):
                was_closed = closed.is_set()
                name = rng.choice(names)
                try:
                    op = step % 4
                    if op == 0:
                        t = shared.get_tensor(name)
                        same(t, tensors[name])
                        kept[tid].append((name, t))
                    elif op == 1:
                        index = random_index(rng, tensors[name].shape)
                        same(shared.get_slice(name)[index], tensors[name][index])
                    elif op == 2:
                        assert shared.keys() == names
                    else:
                        assert shared.get_tensor_meta(name).shape == list(tensors[name].shape)
                except SafetensorError as e:
                    assert str(e) == CLOSED, e
                else:
                    assert not was_closed, "a call that started after __exit__ returned instead of raising"
        barrier.wait()  # everyone is past the close now
        with pytest.raises(SafetensorError, match=CLOSED):
            shared.get_tensor(names[0])
        with pytest.raises(SafetensorError, match=CLOSED):
            shared.get_slice(names[0])

    run_threads(work)
    for per_thread in kept:  # handed out before the close: still readable, still right
        for name, tensor in per_thread:
            same(tensor, tensors[name])


@pytest.mark.parametrize("round_", range(ROUNDS))
def test_loads_on_many_threads_leave_the_collector_as_it_was(model, round_):
    """get_tensors pauses the (process-wide) garbage collector while it builds tensors; with 8 threads in and
    out of that pause, the collector is enabled again once all have left, as it was before."""
    path, tensors = model
    assert gc.isenabled()
    with safe_open(path, "np") as shared:

        def work(tid: int, barrier: threading.Barrier) -> None:
            barrier.wait()
            for _ in range(OPS):
                got = shared.get_tensors()
                assert sorted(got) == sorted(tensors)

        run_threads(work)
    assert gc.isenabled(), "the garbage collector was left disabled"


def test_saving_a_tensor_another_thread_mutates(tmp_path):
    """A tensor written by another thread while it is saved: no crash; the file holds, for each element,
    a value that the memory held (here one of the values written), and the other tensors exactly."""
    moving = np.zeros((256, 1024), dtype=np.int32)
    still = make_tensors(9, count=4)
    stop = threading.Event()

    def writer() -> None:
        v = 0
        while not stop.is_set():
            v = (v + 1) % 100
            moving[:] = v

    t = threading.Thread(target=writer)
    t.start()
    try:
        for i in range(20):
            out = tmp_path / f"m{i}.safetensors"
            save_file({"moving": moving, **still}, str(out))
            back = load(out.read_bytes())
            assert back["moving"].shape == moving.shape
            assert back["moving"].min() >= 0 and back["moving"].max() < 100
            for n, want in still.items():
                same(back[n], want)
    finally:
        stop.set()
        t.join()
