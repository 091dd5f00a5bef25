"""The C++ engine through the binding (_safetensors_cpp.engine.Prefetcher): CPU direct loads into numpy/torch buffers,
staged loads copied out of slabs with ctypes.memmove, both equal to get_tensor; rows, errors, the pool."""

from __future__ import annotations

import ctypes
import os
import threading

import numpy as np
import pytest

from safetensors import SafetensorError, safe_open
from safetensors import _safetensors_cpp as cpp
from safetensors.numpy import save_file


@pytest.fixture
def model(tmp_path):
    rng = np.random.default_rng(0)
    tensors = {f"layer{i}.w": rng.standard_normal((37 + i, 129)).astype(np.float32) for i in range(12)}
    tensors["ids"] = np.arange(1000, dtype=np.int64)
    tensors["empty"] = np.zeros((0, 4), dtype=np.float16)
    path = str(tmp_path / "m.safetensors")
    save_file(tensors, path)
    return path, tensors


def drain(pf, staged_out=None):
    """Runs pf to its end; staged bytes are memmoved into staged_out[piece] (bytearrays). Returns completions."""
    done = []
    while True:
        ev = pf.next()
        if ev.kind == "end":
            return done
        if ev.kind == "staged":
            if ev.size:
                dst = (ctypes.c_char * ev.size).from_buffer(staged_out[ev.piece], ev.offset)
                ctypes.memmove(dst, ev.address, ev.size)
            pf.release(ev.slab)
        if ev.piece_done:
            done.append(ev.piece)


@pytest.mark.parametrize("backend", ["mmap", "pread", "direct", "auto"])
def test_direct_into_numpy_and_torch_buffers(model, backend):
    path, tensors = model
    f = cpp.File(path, backend)
    plan, outs = [], []
    for i, (name, (_code, _shape, begin, end)) in enumerate(f.infos()):
        if i % 2:
            torch = pytest.importorskip("torch")
            out = torch.empty(end - begin, dtype=torch.uint8)
            ptr = out.data_ptr()
        else:
            out = np.empty(end - begin, dtype=np.uint8)
            ptr = out.ctypes.data
        outs.append((name, out))
        plan.append((name, begin, end, ptr))
    with cpp.engine.Prefetcher(f, plan, threads=4) as pf:
        done = drain(pf)
        assert sorted(done) == list(range(len(plan)))
        for i in range(len(plan)):
            pf.wait_piece(i)
        stats = pf.stats()
        assert stats["bytes_direct"] == stats["bytes_read"] == sum(e - b for _, b, e, _ in plan)
    with safe_open(path, framework="np") as h:
        for name, out in outs:
            got = bytes(np.asarray(out).tobytes()) if isinstance(out, np.ndarray) else out.numpy().tobytes()
            assert got == h.get_tensor(name).tobytes(), name


@pytest.mark.parametrize("backend", ["mmap", "pread", "direct", "auto"])
def test_staged_through_slabs_with_memmove(model, backend):
    path, tensors = model
    f = cpp.File(path, backend)
    cpp.engine.slab_pool_set_slab_bytes(4096)
    try:
        plan = [(name, b, e, None) for name, (_, _, b, e) in f.infos()]
        plan.append(("layer3.w", *cpp.engine.row_piece(f, "layer3.w", 5, 17), None))  # rows, as the loader plans them
        out = [bytearray(e - b) for _, b, e, _ in plan]
        with cpp.engine.Prefetcher(f, plan, threads=3) as pf:
            assert len(pf) == len(plan)
            done = drain(pf, out)
            assert sorted(done) == list(range(len(plan)))
            assert pf.stats()["events_lent"] == 0
        with safe_open(path, framework="np") as h:
            for (name, _, _, _), got in zip(plan[:-1], out[:-1]):
                assert bytes(got) == h.get_tensor(name).tobytes(), name
            assert bytes(out[-1]) == h.get_tensor("layer3.w")[5:17].tobytes()
        stats = cpp.engine.slab_pool_stats()
        assert list(stats) == ["capacity", "slab_bytes", "wait_ns", "allocated_bytes", "peak_bytes", "slabs_in_use",
                               "slabs_free", "users", "custom_allocator", "allocations", "frees", "allocator_changes"]
        assert stats["peak_bytes"] <= stats["capacity"]
        assert stats["slabs_in_use"] == 0
    finally:
        cpp.engine.slab_pool_set_slab_bytes(8 << 20)


def test_python_allocator_counts_slabs(model):
    path, _ = model
    f = cpp.File(path)
    live = {}
    calls = {"alloc": 0, "free": 0}
    lock = threading.Lock()

    def alloc(size):
        buf = ctypes.create_string_buffer(size)
        with lock:
            calls["alloc"] += 1
            live[ctypes.addressof(buf)] = buf
        return ctypes.addressof(buf)

    def free(address, size):
        with lock:
            calls["free"] += 1
            del live[address]

    cpp.engine.slab_pool_set_slab_bytes(4096)
    cpp.engine.slab_pool_set_allocator(alloc, free)
    try:
        plan = [(name, b, e, None) for name, (_, _, b, e) in f.infos()]
        out = [bytearray(e - b) for _, b, e, _ in plan]
        with cpp.engine.Prefetcher(f, plan, threads=4) as pf:
            while True:
                ev = pf.next()
                if ev.kind == "end":
                    break
                if ev.size:
                    # The event's bytes lie in one allocation the Python allocator made (a pinned tensor would
                    # be sliced at address - slab_address).
                    assert ev.slab_address in live
                    assert 0 <= ev.address - ev.slab_address <= 4096 - ev.size
                    dst = (ctypes.c_char * ev.size).from_buffer(out[ev.piece], ev.offset)
                    ctypes.memmove(dst, ev.address, ev.size)
                pf.release(ev.slab)
        with safe_open(path, framework="np") as h:
            for (name, _, _, _), got in zip(plan, out):
                assert bytes(got) == h.get_tensor(name).tobytes(), name
        assert calls["alloc"] > 0
        assert calls["alloc"] == calls["free"]  # idle slabs returned once no prefetcher uses the pool
        assert not live
    finally:
        cpp.engine.slab_pool_set_allocator()
        cpp.engine.slab_pool_set_slab_bytes(8 << 20)


def test_errors_are_translated(model, tmp_path):
    path, _ = model
    f = cpp.File(path)
    with pytest.raises(SafetensorError, match="0-d|out of range"):
        cpp.engine.row_piece(f, "ids", 0, 2000)
    with pytest.raises(SafetensorError, match="data buffer"):
        cpp.engine.Prefetcher(f, [("ids", 0, 1 << 40, None)])
    # A file truncated after it was opened: the reader's I/O error comes out of next(), naming the file.
    f = cpp.File(path, "mmap")
    os.truncate(path, f.data_offset + 100)
    pf = cpp.engine.Prefetcher(f, [(name, b, e, None) for name, (_, _, b, e) in f.infos()])
    with pytest.raises(OSError) as info:
        while True:
            ev = pf.next(timeout=10)
            assert ev.kind == "staged"
            pf.release(ev.slab)
    assert "m.safetensors" in str(info.value) and "tensor `" in str(info.value)
    pf.close()
    with pytest.raises(SafetensorError, match="closed"):
        pf.next()


def test_cancel_from_another_thread_wakes_next(model):
    path, _ = model
    f = cpp.File(path)
    cpp.engine.slab_pool_set_slab_bytes(4096)
    cpp.engine.slab_pool_set_capacity(4096)
    try:
        pf = cpp.engine.Prefetcher(f, [(name, b, e, None) for name, (_, _, b, e) in f.infos() if e > b])
        ev = pf.next()  # held: the only slab
        assert ev.kind == "staged"
        while pf.next(timeout=0.2).kind != "timeout":
            pass
        threading.Timer(0.1, pf.cancel).start()
        with pytest.raises(SafetensorError, match="cancelled"):
            pf.next()
        pf.release(ev.slab)
        pf.close()
    finally:
        cpp.engine.slab_pool_set_capacity(256 << 20)
        cpp.engine.slab_pool_set_slab_bytes(8 << 20)
