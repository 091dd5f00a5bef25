"""The simulated NPU's asynchronous copies (tests/python/npu_sim): non-blocking host-to-device copies from pinned
memory are queued on the destination device's one stream and run later, reading the pinned bytes only then, as
on a real device; everything else waits for the queue; events and streams follow it. Then the loading
engine's staged path (safetensors._engine over the C++ slab pool) against it: byte-exact with its event
waits, corrupted without them.

Outcomes never depend on timing: what has or has not run is decided by ``npu_sim.pause_queue`` (or, in one
test, by a copy delay a thousand times longer than the work it races). Like test_npu_sim.py, the simulator
changes the whole process, so in a process without it these tests run in a child pytest, reported by
``test_npu_async_in_a_child_process``.
"""

from __future__ import annotations

import gc

import pytest
import torch

import npu_sim

MiB = 2**20


@pytest.fixture(autouse=True)
def _npu(request):
    if not npu_sim.enter_test(request, "test_npu_async_in_a_child_process"):
        yield
        return
    npu_sim.set_async_copies(True)
    npu_sim.set_copy_delay_us(2000)
    npu_sim.synchronize()
    npu_sim.reset_copy_stats()
    yield
    for index in range(2):  # a failed test must not leave a queue held for the next one
        npu_sim.resume_queue(index)
    npu_sim.set_copy_delay_us(2000)
    npu_sim.synchronize()
    torch.npu.set_device(0)


def test_npu_async_in_a_child_process():
    npu_sim.run_file_in_child(__file__, 14)


def pinned_range(n: int, start: int = 0) -> torch.Tensor:
    return (torch.arange(start, start + n, dtype=torch.int64) % 251).to(torch.uint8).pin_memory()


def raw(t: torch.Tensor) -> bytes:
    t = t.detach().to("cpu").contiguous()
    return t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""


# ---- the queue ----

def test_an_async_copy_is_pending_until_synchronize():
    source = pinned_range(4096)
    with npu_sim.copy_delay(2_000_000):  # 2 s: the checks below take microseconds
        on_device = source.to("npu:0", non_blocking=True)
        event = torch.npu.Event()
        event.record()
        assert not event.query()
        assert npu_sim.queue_depth(0) == 1
        assert not torch.npu.current_stream(0).query()
        assert npu_sim.copy_stats()["async"]["count"] == 0
        torch.npu.synchronize()
        assert event.query() and torch.npu.current_stream(0).query() and npu_sim.queue_depth(0) == 0
    assert raw(on_device) == raw(source)
    stats = npu_sim.copy_stats()
    assert stats["async"] == {"count": 1, "bytes": 4096, "max_depth": 1}
    assert stats["h2d"] == {"count": 1, "bytes": 4096} and stats["non_blocking"] == 1


DTYPES = [
    torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.uint16, torch.uint32,
    torch.uint64, torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.complex64,
    torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e8m0fnu, torch.float4_e2m1fn_x2,
]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_queued_copies_move_every_dtype_exactly(dtype):
    g = torch.Generator().manual_seed(DTYPES.index(dtype))
    data = torch.randint(0, 256, (6, 4 * dtype.itemsize), dtype=torch.uint8, generator=g)
    source = (data % 2).bool() if dtype == torch.bool else data.view(dtype)
    pinned = source.pin_memory()
    with npu_sim.queue_paused(1):
        on_device = pinned.to("npu:1", non_blocking=True)
        transposed = torch.empty(pinned.t().shape, dtype=dtype, device="npu:1")
        transposed.copy_(pinned.t(), non_blocking=True)  # a strided source: copied element by element
        assert npu_sim.queue_depth(1) == 2
    assert raw(on_device) == raw(source) and raw(transposed) == raw(source.t())


def test_a_queued_copy_can_convert_dtypes_and_broadcast():
    source = torch.tensor([1.5, -2.25, 1e5, 3.0, float("inf")], dtype=torch.float32).pin_memory()
    half = torch.empty(5, dtype=torch.float16, device="npu:0")
    rows = torch.empty((3, 5), dtype=torch.float32, device="npu:0")
    with npu_sim.queue_paused(0):
        half.copy_(source, non_blocking=True)
        rows.copy_(source, non_blocking=True)  # a row broadcast to every row of the destination
        assert npu_sim.queue_depth(0) == 2
    assert torch.equal(half.cpu(), source.half())
    assert torch.equal(rows.cpu(), source.expand(3, 5))


def test_a_paused_queue_runs_nothing_until_resumed():
    source = pinned_range(1000)
    npu_sim.pause_queue(1)
    try:
        on_device = source.to("npu:1", non_blocking=True)
        event = torch.npu.Event()
        event.record(torch.npu.current_stream(1))
        assert not event.query() and npu_sim.queue_depth(1) == 1
        assert npu_sim.queue_depth(0) == 0  # queues are per device
    finally:
        npu_sim.resume_queue(1)
    event.synchronize()
    assert event.query() and npu_sim.queue_depth(1) == 0
    assert raw(on_device) == raw(source)


def test_the_copy_timeline_records_each_queued_copy_in_order():
    source = pinned_range(4096)
    npu_sim.record_copy_timeline()
    try:
        with npu_sim.queue_paused(1):
            first = source.to("npu:1", non_blocking=True)
            second = source[:100].to("npu:1", non_blocking=True)
            blocking = source.to("npu:0")  # not queued: not on the timeline
        npu_sim.synchronize()
        timeline = npu_sim.copy_timeline()
    finally:
        npu_sim.record_copy_timeline(False)
    assert [(c["device"], c["bytes"]) for c in timeline] == [(1, 4096), (1, 100)]
    assert all(c["issued"] <= c["started"] <= c["finished"] for c in timeline)
    assert timeline[0]["finished"] <= timeline[1]["started"]  # one stream: one copy after the other
    assert raw(first) == raw(source) and raw(second) == raw(source[:100]) and raw(blocking) == raw(source)
    source.to("npu:0", non_blocking=True)
    npu_sim.synchronize()
    assert len(npu_sim.copy_timeline()) == 2  # recording is off
    npu_sim.record_copy_timeline()  # turning it on forgets what was recorded
    npu_sim.record_copy_timeline(False)
    assert npu_sim.copy_timeline() == []


def test_overwriting_the_pinned_source_before_the_copy_ran_lands_the_new_bytes():
    source = pinned_range(4096)
    old = raw(source)
    with npu_sim.queue_paused(0):
        on_device = source.to("npu:0", non_blocking=True)
        source.fill_(0x5A)  # what a loader does when it refills a staging buffer too early
    torch.npu.synchronize(0)
    assert raw(on_device) == bytes([0x5A]) * 4096 != old  # the device read the buffer when the copy ran


def test_only_non_blocking_copies_from_pinned_memory_are_queued():
    pageable = torch.arange(256, dtype=torch.int32)
    pinned = pageable.pin_memory()
    with npu_sim.queue_paused(0):
        from_pageable = pageable.to("npu:0", non_blocking=True)  # pageable: synchronous, as on CUDA
        blocking = pinned.to("npu:0")  # blocking: synchronous (nothing queued to wait for yet)
        pageable.fill_(-1)
        pinned.fill_(-1)
        assert npu_sim.queue_depth(0) == 0
    assert torch.equal(from_pageable.cpu(), torch.arange(256, dtype=torch.int32))
    assert torch.equal(blocking.cpu(), torch.arange(256, dtype=torch.int32))
    npu_sim.set_async_copies(False)
    try:
        with npu_sim.queue_paused(0):
            pinned.copy_(torch.arange(256, dtype=torch.int32))
            off = pinned.to("npu:0", non_blocking=True)
            assert npu_sim.queue_depth(0) == 0
    finally:
        npu_sim.set_async_copies(True)
    assert torch.equal(off.cpu(), torch.arange(256, dtype=torch.int32))
    assert npu_sim.copy_stats()["async"]["count"] == 0


def test_every_other_operation_waits_for_the_queue():
    """Single-stream order: a blocking copy, a device-to-host copy, fill_, the CPU fallback and a
    device-to-device copy each see every copy queued before them (and come after them)."""
    with npu_sim.copy_delay(20_000):  # slow enough that each operation below really has to wait
        target = torch.zeros(5 * 100, dtype=torch.uint8, device="npu:0")
        sources = [pinned_range(100, 7 * i) for i in range(5)]
        with npu_sim.queue_paused(0):
            for i, source in enumerate(sources):
                target[100 * i : 100 * (i + 1)].copy_(source, non_blocking=True)
            assert npu_sim.queue_depth(0) == 5
        assert npu_sim.copy_stats()["async"]["max_depth"] == 5
        expected = b"".join(raw(s) for s in sources)
        assert raw(target) == expected  # .cpu() waited for all five

        target.copy_(pinned_range(500, 3), non_blocking=True)
        target[:100].copy_(torch.full((100,), 9, dtype=torch.uint8))  # blocking: runs after the queued copy
        assert raw(target) == bytes([9]) * 100 + raw(pinned_range(500, 3))[100:]

        target.copy_(pinned_range(500, 11), non_blocking=True)
        target.fill_(4)  # fill_ comes after the queued copy, not before it
        assert raw(target) == bytes([4]) * 500

        target.copy_(pinned_range(500, 13), non_blocking=True)
        plus_one = target + 1  # the CPU fallback reads the copied bytes
        assert raw(plus_one) == raw((pinned_range(500, 13) + 1))

        target.copy_(pinned_range(500, 17), non_blocking=True)
        on_other = target.to("npu:1")  # device to device
        assert raw(on_other) == raw(pinned_range(500, 17))

        target.copy_(pinned_range(500, 19), non_blocking=True)
        target.resize_(1000)  # reallocating keeps the bytes the queued copy wrote
        assert raw(target[:500]) == raw(pinned_range(500, 19))
    stats = npu_sim.copy_stats()
    assert stats["async"]["count"] == 10 and stats["async"]["bytes"] == 5 * 100 + 5 * 500


def test_waiting_on_a_paused_queue_is_an_error_not_a_hang():
    on_device = torch.empty(64, dtype=torch.uint8, device="npu:0")
    with npu_sim.queue_paused(0):
        on_device.copy_(pinned_range(64), non_blocking=True)
        event = torch.npu.Event()
        event.record()
        for wait in (torch.npu.synchronize, event.synchronize, on_device.cpu, lambda: on_device.fill_(0),
                     lambda: npu_sim.synchronize(0), torch.npu.current_stream(0).synchronize):
            with pytest.raises(RuntimeError, match=r"copy queue of npu:0, which is paused with 1 copy"):
                wait()
        torch.npu.synchronize(1)  # the other device's queue is not held
    assert raw(on_device) == raw(pinned_range(64))


def test_events_and_streams_follow_the_queue_across_devices():
    with npu_sim.queue_paused(0):
        torch.empty(8, dtype=torch.uint8, device="npu:0").copy_(pinned_range(8), non_blocking=True)
        on0 = torch.npu.Event()
        on0.record()
        torch.npu.current_stream(0).wait_event(on0)  # the same device's stream: already in order, no wait
        assert not on0.query()
        assert torch.npu.current_stream(1).query()  # device 1 has nothing queued
    with npu_sim.copy_delay(100_000):
        on_device = pinned_range(128).to("npu:1", non_blocking=True)
        on1 = torch.npu.Event()
        on1.record(torch.npu.current_stream(1))
        torch.npu.current_stream(0).wait_event(on1)  # another device's event: waited for until complete
        assert on1.query()
    on0.synchronize()
    assert on0.query()
    assert raw(on_device) == raw(pinned_range(128))
    unrecorded = torch.npu.Event()
    assert unrecorded.query()
    unrecorded.synchronize()


def test_torch_accelerator_synchronize_drains_the_current_device():
    with npu_sim.copy_delay(50_000):
        on_device = pinned_range(32).to("npu:0", non_blocking=True)
        torch.accelerator.synchronize()
        assert npu_sim.queue_depth(0) == 0
    assert raw(on_device) == raw(pinned_range(32))


def test_freeing_either_side_of_a_queued_copy_is_safe():
    gc.collect()  # garbage of earlier tests must not be freed between the counts below
    pinned_before = npu_sim.pinned_bytes_allocated()
    device_before = npu_sim.bytes_allocated(0)
    with npu_sim.queue_paused(0):
        source = pinned_range(3 * MiB)
        kept = source.to("npu:0", non_blocking=True)
        dropped = source.to("npu:0", non_blocking=True)
        del source, dropped  # the queued copies hold both memories
        assert npu_sim.pinned_bytes_allocated() == pinned_before + 3 * MiB
        assert npu_sim.bytes_allocated(0) == device_before + 2 * 3 * MiB
    torch.npu.synchronize()
    assert raw(kept) == raw(pinned_range(3 * MiB))
    assert npu_sim.pinned_bytes_allocated() == pinned_before  # released once the copies ran
    del kept
    assert npu_sim.bytes_allocated(0) == device_before


def test_the_delay_and_the_switch_are_settable():
    assert npu_sim.copy_delay_us() == 2000
    with npu_sim.copy_delay(0):
        assert npu_sim.copy_delay_us() == 0
    assert npu_sim.copy_delay_us() == 2000
    with pytest.raises(ValueError, match="copy delay"):
        npu_sim.set_copy_delay_us(-1)
    with pytest.raises(ValueError, match="no simulated npu device 2"):
        npu_sim.pause_queue(2)
    assert npu_sim.async_copies()


def test_the_environment_sets_the_delay_and_can_turn_queuing_off(tmp_path):
    import os
    import subprocess
    import sys
    from pathlib import Path

    script = ("import npu_sim, torch; npu_sim.install(2); "
              "print(npu_sim.copy_delay_us(), npu_sim.async_copies(), flush=True)")
    tests_dir = str(Path(__file__).resolve().parents[1])
    env = dict(os.environ, NPU_SIM_COPY_DELAY_US="12345", NPU_SIM_ASYNC="0",
               PYTHONPATH=os.pathsep.join(filter(None, [tests_dir, os.environ.get("PYTHONPATH")])))
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0 and proc.stdout.split() == ["12345", "False"], proc.stdout + proc.stderr


# ---- the staged loader against the queue ----

@pytest.fixture
def small_pool(monkeypatch):
    """The engine's slab pool shrunk to two 1 MiB slabs and one reader thread (slabs taken in file order), so
    which slab a chunk lands in is fixed; restored afterwards."""
    import safetensors.torch as st
    from safetensors import _engine

    monkeypatch.setattr(_engine, "READER_THREADS", 1)
    _engine._cpp.engine.slab_pool_set_slab_bytes(MiB)
    _engine.set_staging_capacity(2 * MiB)
    yield st
    _engine.set_staging_capacity(256 * MiB)
    _engine._cpp.engine.slab_pool_set_slab_bytes(8 * MiB)


def save_big(tmp_path, sizes_mib, data_at_mib: bool = False) -> tuple:
    """A file of uint8 tensors of the given sizes. ``data_at_mib``: metadata pads the header so the data
    buffer starts exactly 1 MiB into the file, so 1 MiB engine reads (cut at page boundaries of the file)
    are exactly the tensor's 1 MiB chunks."""
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(5)
    state = {f"t{i}": torch.randint(0, 256, (int(n * MiB),), dtype=torch.uint8, generator=g)
             for i, n in enumerate(sizes_mib)}
    path = tmp_path / "big.safetensors"
    if not data_at_mib:
        save_file(state, path)
        return path, state
    save_file(state, path, metadata={"pad": ""})
    raw_header = path.read_bytes()[8 : 8 + int.from_bytes(path.read_bytes()[:8], "little")]
    unpadded = len(raw_header.rstrip(b" "))
    save_file(state, path, metadata={"pad": "x" * (MiB - 8 - unpadded)})
    assert 8 + int.from_bytes(path.read_bytes()[:8], "little") == MiB
    return path, state


def test_a_staged_load_larger_than_the_pool_is_exact_with_async_copies(tmp_path):
    import safetensors.torch as st
    from safetensors import _engine

    path, state = save_big(tmp_path, [170, 0.5, 96])  # more than the whole 256 MiB pool: slabs are reused
    nbytes = sum(t.numel() for t in state.values())
    assert nbytes > 256 * MiB
    _engine.reset_staging_peak()
    loaded = st.load_file(path, device="npu:0")
    assert all(raw(loaded[k]) == raw(v) for k, v in state.items())
    stats = npu_sim.copy_stats()
    assert stats["h2d"]["bytes"] == stats["async"]["bytes"] == nbytes  # every byte went through the queue
    assert stats["async"]["count"] == stats["h2d"]["count"] == stats["non_blocking"] >= 34
    assert _engine.staging_stats()["peak_bytes"] <= 256 * MiB


@pytest.mark.parametrize("device", ["npu:0", "npu:1"])
def test_many_refills_of_a_small_pool_are_exact(tmp_path, small_pool, device):
    st = small_pool
    path, state = save_big(tmp_path, [5.5, 0.25, 3, 0.001, 4])
    with npu_sim.copy_delay(5000):
        loaded = st.load_file(path, device=device, backend="pread")
    assert all(raw(loaded[k]) == raw(v) for k, v in state.items())
    assert npu_sim.copy_stats()["async"]["count"] >= 13


def assert_corrupted(got: bytes, data: bytes) -> None:
    """Three 1 MiB chunks through two slabs, every copy deferred and every slab handed back at once: some slab
    takes a later chunk before the device copied the earlier one out of it, so an earlier chunk arrives
    with a later chunk's bytes (which slab is reused first is the pool's choice; that one is always wrong is
    certain). The last chunk is always right: nothing overwrites its slab."""
    chunks = [data[k * MiB : (k + 1) * MiB] for k in range(3)]
    delivered = [got[k * MiB : (k + 1) * MiB] for k in range(3)]
    assert got != data
    assert all(d in chunks for d in delivered)  # whole chunks, from the wrong slab contents
    assert delivered[2] == chunks[2]
    assert any(delivered[k] == chunks[j] for k in range(2) for j in range(k + 1, 3))


def without_the_event_wait(monkeypatch):
    """The loader believing every copy complete at once: it returns slabs to the pool while the device still
    has to copy out of them."""
    from safetensors import _engine

    monkeypatch.setattr(_engine, "_done", lambda event: True)
    monkeypatch.setattr(_engine, "_await", lambda event: None)


def test_negative_control_without_the_event_wait_the_load_is_corrupted(tmp_path, monkeypatch, small_pool):
    """The loader's own wait is what keeps the load exact: without it and with device 0's queue held until
    the load returns, the first slab is refilled before the device copied out of it, every time."""
    st = small_pool
    without_the_event_wait(monkeypatch)
    path, state = save_big(tmp_path, [3], data_at_mib=True)
    npu_sim.set_async_copies(False)  # the simulator's blind spot before it queued copies: the broken loader passes
    try:
        with npu_sim.queue_paused(0):
            assert raw(st.load_file(path, device="npu:0")["t0"]) == raw(state["t0"])
    finally:
        npu_sim.set_async_copies(True)
    with npu_sim.queue_paused(0):
        loaded = st.load_file(path, device="npu:0")
        assert npu_sim.queue_depth(0) == 3  # the load returned with its copies still queued
    torch.npu.synchronize(0)
    assert_corrupted(raw(loaded["t0"]), raw(state["t0"]))


def test_negative_control_by_delay_alone(tmp_path, monkeypatch, small_pool):
    """The same without the pause: a 1 s copy delay against refilling a 1 MiB slab (about a millisecond)."""
    st = small_pool
    without_the_event_wait(monkeypatch)
    path, state = save_big(tmp_path, [3], data_at_mib=True)
    with npu_sim.copy_delay(1_000_000):
        loaded = st.load_file(path, device="npu:0")
        got = raw(loaded["t0"])
    assert_corrupted(got, raw(state["t0"]))


def test_with_the_event_wait_the_loader_waits_for_the_device_before_refilling(tmp_path, small_pool):
    """The positive control of the negative one: the unmodified loader, with the queue held, must wait for
    the first slab's copy before that slab is refilled -- here it meets the paused queue and raises instead
    of corrupting."""
    st = small_pool
    path, state = save_big(tmp_path, [3], data_at_mib=True)
    with npu_sim.queue_paused(0):
        with pytest.raises(RuntimeError, match="copy queue of npu:0, which is paused"):
            st.load_file(path, device="npu:0")
        assert npu_sim.queue_depth(0) in (1, 2)  # at most both slabs copied; neither refilled
    torch.npu.synchronize(0)
    loaded = st.load_file(path, device="npu:0")  # the pool is in a usable state after the failed load
    assert raw(loaded["t0"]) == raw(state["t0"])


# ---- who owns the slab pool's allocator ----

@pytest.fixture
def foreign_allocator():
    """Another caller's slab allocator on the process-wide pool: page-locked memory of the simulator's, kept by
    address, counting its calls. Restores the default allocator afterwards."""
    from safetensors import _engine

    live, calls = {}, {"alloc": 0, "free": 0}

    def alloc(size):
        buf = torch.empty(size, dtype=torch.uint8, pin_memory=True)
        live[buf.data_ptr()] = buf
        calls["alloc"] += 1
        return buf.data_ptr()

    def free(address, size):
        live.pop(address)
        calls["free"] += 1

    _engine._cpp.engine.slab_pool_set_allocator(alloc, free)
    yield calls
    _engine._cpp.engine.slab_pool_set_allocator()


def test_a_load_leaves_another_callers_allocator_in_place_and_copies_synchronously(tmp_path, foreign_allocator,
                                                                                  caplog):
    import logging

    import safetensors.torch as st
    from safetensors import _engine

    path, state = save_big(tmp_path, [9, 0.25, 3])
    nbytes = sum(t.numel() for t in state.values())
    before = _engine.staging_stats()
    with caplog.at_level(logging.DEBUG, logger="safetensors"):
        with npu_sim.copy_delay(20_000):  # a slab recycled under a pending copy would land wrong bytes
            loaded = st.load_file(path, device="npu:0")
    assert all(raw(loaded[k]) == raw(v) for k, v in state.items())
    stats = _engine.staging_stats()
    # The other caller's allocator made the slabs and is still the pool's: the load did not replace it.
    assert foreign_allocator["alloc"] > 0
    assert stats["custom_allocator"] == 1 and stats["allocator_changes"] == before["allocator_changes"]
    assert stats["pool_allocator_ours"] == 0
    # Its memory is not ours to trust: every copy ran synchronously, none through the device queue.
    copies = npu_sim.copy_stats()
    assert copies["h2d"]["bytes"] == nbytes and copies["async"]["count"] == 0 and copies["non_blocking"] == 0
    assert stats["foreign_slab_copies"] - before["foreign_slab_copies"] == copies["h2d"]["count"]
    assert any("not safetensors'" in r.getMessage() for r in caplog.records)
    assert any("another allocator's slabs" in r.getMessage() for r in caplog.records)


def test_once_the_default_allocator_is_back_a_load_installs_ours_again(tmp_path):
    import safetensors.torch as st
    from safetensors import _engine

    _engine._cpp.engine.slab_pool_set_allocator()  # whatever was there: the default
    path, state = save_big(tmp_path, [9])
    loaded = st.load_file(path, device="npu:0")
    assert raw(loaded["t0"]) == raw(state["t0"])
    stats = _engine.staging_stats()
    assert stats["pool_allocator_ours"] == 1 and stats["custom_allocator"] == 1
    copies = npu_sim.copy_stats()
    assert copies["async"]["bytes"] == copies["h2d"]["bytes"] == 9 * MiB  # pinned slabs, queued copies
