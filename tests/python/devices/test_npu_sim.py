"""Tests of the simulated NPU (tests/python/npu_sim): the backend the loader's npu tests run against.

``npu_sim.install()`` registers ``npu`` for the rest of the process, as importing torch_npu does, and other
modules test a torch without it (test_torch.py checks the error for a missing torch_npu). So when this file is
collected in a process without the simulator, its tests run in a child pytest process, reported by
``test_simulator_in_a_child_process``, and are skipped here; in that child (NPU_SIM_IN_PROCESS=1), or in any
process that has installed the simulator, they run in-process.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import zlib
from pathlib import Path

import pytest
import torch

import npu_sim

DTYPES = [
    torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.uint16, torch.uint32,
    torch.uint64, torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.complex64,
    torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e8m0fnu, torch.float8_e4m3fnuz, torch.float8_e5m2fnuz,
    torch.float4_e2m1fn_x2,
]


@pytest.fixture(autouse=True)
def _simulator(request):
    if not npu_sim.enter_test(request, "test_simulator_in_a_child_process"):
        yield
        return
    yield
    torch.npu.set_device(0)


def test_simulator_in_a_child_process():
    npu_sim.run_file_in_child(__file__, 30)


def random_tensor(dtype: torch.dtype, rows: int = 4, cols: int = 6) -> torch.Tensor:
    """Random bit patterns (NaNs and infinities included) viewed as ``dtype``; bools are 0 or 1. Seeded by the
    dtype: the same bits on every run."""
    itemsize = torch.empty(0, dtype=dtype).element_size()
    g = torch.Generator().manual_seed(zlib.crc32(str(dtype).encode()))
    raw = torch.randint(0, 256, (rows, cols * itemsize), dtype=torch.uint8, generator=g)
    if dtype == torch.bool:
        return (raw % 2).bool()
    return raw.view(dtype)


def bits(t: torch.Tensor) -> torch.Tensor:
    """The bytes of a CPU tensor, for exact comparison whatever the dtype (NaN != NaN)."""
    assert t.device.type == "cpu"
    return t.contiguous().view(torch.uint8)


# ---- registration ----

def test_install_is_idempotent_and_the_device_count_is_fixed():
    npu_sim.install()
    npu_sim.install(2)
    assert npu_sim.installed() and npu_sim.num_devices() == 2
    with pytest.raises(RuntimeError, match="already installed with 2 device"):
        npu_sim.install(3)
    with pytest.raises(ValueError, match="num_devices"):
        npu_sim.install(0)
    assert torch.npu.device_count() == 2


def test_npu_is_a_torch_device_type_with_a_runtime_module():
    device = torch.device("npu:1")
    assert (device.type, device.index) == ("npu", 1)
    assert torch.device("npu").index is None
    assert torch._C._get_privateuse1_backend_name() == "npu"
    assert torch.npu.is_available() is True
    assert torch.npu.device_count() == 2
    assert torch.npu.current_device() == 0
    assert torch.accelerator.current_accelerator() == torch.device("npu")
    assert torch.accelerator.device_count() == 2
    import sys
    assert sys.modules["torch.npu"] is torch.npu


# ---- allocation and copies ----

@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_every_dtype_round_trips_cpu_npu0_npu1_cpu_exactly(dtype):
    source = random_tensor(dtype)
    on0 = source.to("npu:0", non_blocking=True)
    on1 = on0.to("npu:1")
    back = on1.cpu()
    for t, index in ((on0, 0), (on1, 1)):
        assert t.device == torch.device("npu", index) and t.dtype == dtype and t.shape == source.shape
        assert npu_sim.device_of(t) == index
        assert t.untyped_storage().device == torch.device("npu", index)
        assert t.untyped_storage().nbytes() == source.numel() * source.element_size()
        assert t.data_ptr() == t.untyped_storage().data_ptr() != 0
    assert back.device.type == "cpu" and back.dtype == dtype
    assert torch.equal(bits(back), bits(source))
    assert torch.equal(bits(on1.to("cpu")), bits(source))
    # copy_ in both directions, into tensors allocated on each device
    target = torch.empty(source.shape, dtype=dtype, device="npu:1")
    target.copy_(source)
    host = torch.empty(source.shape, dtype=dtype)
    host.copy_(target)
    assert torch.equal(bits(host), bits(source))
    # strided copies: a transposed npu tensor made contiguous on the device
    transposed = on1.t().contiguous()
    assert transposed.device == torch.device("npu:1") and transposed.is_contiguous()
    assert torch.equal(bits(transposed.cpu()), bits(source.t().contiguous()))


def test_empty_gives_fresh_device_memory_and_zeros_writes_it():
    empty = torch.empty((3, 5), dtype=torch.int16, device="npu:1")
    assert empty.device == torch.device("npu:1") and npu_sim.device_of(empty) == 1
    assert bool((bits(empty.cpu()) == npu_sim.POISON_BYTE).all())  # never zeroed: a load must write every byte
    zeros = torch.zeros((2, 3), dtype=torch.bfloat16, device="npu:0")
    assert zeros.device == torch.device("npu:0") and npu_sim.device_of(zeros) == 0
    assert torch.equal(zeros.cpu(), torch.zeros((2, 3), dtype=torch.bfloat16))
    ones = torch.ones(4, dtype=torch.float8_e4m3fn, device="npu:1")
    assert torch.equal(bits(ones.cpu()), bits(torch.ones(4, dtype=torch.float8_e4m3fn)))


def test_npu_memory_is_separate_from_cpu_memory():
    source = torch.arange(10, dtype=torch.float32)
    on_npu = source.to("npu:0")
    assert npu_sim.device_of(source) is None and npu_sim.device_of(on_npu) == 0
    assert on_npu.data_ptr() != source.data_ptr()
    source.fill_(-1)  # mutating the source after the copy does not reach the device
    assert torch.equal(on_npu.cpu(), torch.arange(10, dtype=torch.float32))
    host = on_npu.cpu()
    on_npu.copy_(torch.full((10,), 7.0))  # nor does writing the device reach an earlier host copy
    assert torch.equal(host, torch.arange(10, dtype=torch.float32))
    assert torch.equal(on_npu.cpu(), torch.full((10,), 7.0))
    on_npu_again = on_npu.to("npu:0")  # same device: torch returns the tensor itself, as for CUDA
    assert on_npu_again.data_ptr() == on_npu.data_ptr()
    copy = on_npu.to("npu:0", copy=True)
    assert copy.data_ptr() != on_npu.data_ptr() and npu_sim.device_of(copy) == 0


def test_each_device_keeps_its_own_allocations():
    before = [npu_sim.bytes_allocated(i) for i in range(2)]
    stats_before = npu_sim.memory_stats(1)
    a = torch.empty(1000, dtype=torch.uint8, device="npu:1")
    assert [npu_sim.bytes_allocated(i) - before[i] for i in range(2)] == [0, 1000]
    assert torch.npu.memory_allocated(1) == npu_sim.bytes_allocated(1)
    b = a.to("npu:0")
    assert [npu_sim.bytes_allocated(i) - before[i] for i in range(2)] == [1000, 1000]
    stats = npu_sim.memory_stats(1)
    assert stats["live_blocks"] == stats_before["live_blocks"] + 1
    assert stats["total_blocks"] == stats_before["total_blocks"] + 1
    assert stats["total_bytes"] == stats_before["total_bytes"] + 1000
    del a
    assert [npu_sim.bytes_allocated(i) - before[i] for i in range(2)] == [1000, 0]
    del b
    assert [npu_sim.bytes_allocated(i) for i in range(2)] == before
    with pytest.raises(ValueError, match="no simulated npu device 2"):
        npu_sim.bytes_allocated(2)


def test_copy_stats_count_each_requested_copy():
    source = torch.arange(8, dtype=torch.int32)
    on0 = source.to("npu:0", non_blocking=True)
    on1 = on0.to("npu:1")
    destination = torch.empty(8, dtype=torch.int32)
    destination.copy_(on1)
    stats = npu_sim.copy_stats()
    assert stats["h2d"] == {"count": 1, "bytes": 32}
    assert stats["d2d"] == {"count": 1, "bytes": 32}
    assert stats["d2h"] == {"count": 1, "bytes": 32}
    assert stats["non_blocking"] == 1
    assert stats["fallback"] == {"count": 0, "bytes": 0}
    assert stats["async"] == {"count": 0, "bytes": 0, "max_depth": 0}  # pageable sources are copied at once
    npu_sim.reset_copy_stats()
    assert npu_sim.copy_stats()["h2d"] == {"count": 0, "bytes": 0}


def test_copies_convert_dtypes_like_cpu_copies():
    source = torch.tensor([1.5, -2.25, 1e5, 3.0], dtype=torch.float32)
    half = torch.empty(4, dtype=torch.float16, device="npu:0")
    half.copy_(source)
    assert torch.equal(half.cpu(), source.half())
    assert torch.equal(source.to("npu:1", dtype=torch.bfloat16).cpu(), source.bfloat16())
    assert torch.equal(half.to(torch.float32).cpu(), source.half().float())


def test_views_share_device_memory():
    t = torch.arange(12, dtype=torch.float32).to("npu:1")
    as_int = t.view(torch.int32)
    assert as_int.device == t.device and as_int.data_ptr() == t.data_ptr()
    assert torch.equal(as_int.cpu(), torch.arange(12, dtype=torch.float32).view(torch.int32))
    as_bytes = t.view(torch.uint8)
    assert as_bytes.shape == (48,) and npu_sim.device_of(as_bytes) == 1
    reshaped = t.reshape(3, 4)
    assert reshaped.data_ptr() == t.data_ptr() and reshaped.device == torch.device("npu:1")
    assert torch.equal(reshaped.cpu(), torch.arange(12.0).reshape(3, 4))
    tail = t[4:]
    assert tail.data_ptr() == t.data_ptr() + 16 and npu_sim.device_of(tail) == 1
    assert torch.equal(tail.cpu(), torch.arange(4.0, 12.0))
    assert torch.equal(t.narrow(0, 2, 3).cpu(), torch.arange(2.0, 5.0))
    assert torch.equal(t.view(3, 4)[:, 1].contiguous().cpu(), torch.tensor([1.0, 5.0, 9.0]))
    assert t.contiguous() is t
    complex_view = t.view(torch.complex64)
    assert torch.equal(torch.view_as_real(complex_view).cpu(), torch.arange(12.0).view(6, 2))
    tail.copy_(torch.zeros(8))  # writing through a view writes the base
    assert torch.equal(t.cpu()[4:], torch.zeros(8))


def test_resizing_keeps_device_and_bytes():
    t = torch.arange(4, dtype=torch.int64).to("npu:1")
    t.resize_(8)
    assert t.device == torch.device("npu:1") and npu_sim.device_of(t) == 1
    assert torch.equal(t.cpu()[:4], torch.arange(4))
    storage = torch.arange(4, dtype=torch.uint8).to("npu:1").untyped_storage()
    storage.resize_(100)
    assert storage.nbytes() == 100 and storage.device == torch.device("npu:1")
    assert torch.equal(torch.empty(0, dtype=torch.uint8, device="npu:1").set_(storage).cpu()[:4], torch.arange(4,
                      dtype=torch.uint8))


# ---- current device, invalid devices ----

def test_current_device_is_per_thread_and_used_for_bare_npu():
    torch.npu.set_device(1)
    assert torch.npu.current_device() == 1
    assert torch.empty(2, device="npu").device == torch.device("npu:1")
    assert torch.arange(3).to("npu").device == torch.device("npu:1")
    assert torch.arange(3).npu().device == torch.device("npu:1")
    seen = []
    thread = threading.Thread(target=lambda: seen.append(torch.npu.current_device()))
    thread.start()
    thread.join()
    assert seen == [0]  # a new thread starts on device 0, as with CUDA
    torch.npu.set_device("npu:0")
    with torch.npu.device(1):
        assert torch.empty(1, device="npu").device == torch.device("npu:1")
    assert torch.npu.current_device() == 0
    assert torch.arange(2).npu(1).device == torch.device("npu:1") and torch.arange(2).npu(1).is_npu
    assert torch.arange(2).untyped_storage().npu(1).device == torch.device("npu:1")


def test_an_index_beyond_the_device_count_is_an_error():
    assert torch.device("npu:5").index == 5  # torch parses any index; the backend rejects it on use
    before = [npu_sim.bytes_allocated(i) for i in range(2)]
    message = "invalid device ordinal 5: the simulated backend has 2 npu device"
    with pytest.raises(RuntimeError, match=message):
        torch.empty(3, device="npu:5")
    with pytest.raises(RuntimeError, match=message):
        torch.arange(3).to("npu:5")
    with pytest.raises(RuntimeError, match=message):
        torch.npu.set_device(5)
    assert [npu_sim.bytes_allocated(i) for i in range(2)] == before
    assert torch.npu.current_device() == 0


# ---- host access ----

HOST_ACCESS_SCRIPT = """
import ctypes, torch, npu_sim
npu_sim.install(2)
pinned = torch.arange(4, dtype=torch.uint8).pin_memory()
assert ctypes.string_at(pinned.data_ptr(), 4) == bytes([0, 1, 2, 3])  # pinned memory is host memory
on_device = torch.arange(4, dtype=torch.uint8).to("npu:1")
print("protected:", npu_sim.protects_device_memory(), flush=True)
print("device bytes:", list(ctypes.string_at(on_device.data_ptr(), 4)), flush=True)
"""


def run_host_access_script(**env: str) -> subprocess.CompletedProcess:
    tests_dir = str(Path(__file__).resolve().parents[1])
    environment = {name: value for name, value in os.environ.items() if name != "NPU_SIM_HOST_ACCESS"}
    environment.update(PYTHONPATH=os.pathsep.join(filter(None, [tests_dir, os.environ.get("PYTHONPATH")])), **env)
    return subprocess.run([sys.executable, "-c", HOST_ACCESS_SCRIPT], env=environment, capture_output=True, text=True,
                          timeout=600)


def test_host_code_cannot_touch_device_memory():
    proc = run_host_access_script()
    assert proc.returncode == -signal.SIGSEGV, proc.stdout + proc.stderr
    assert "protected: True" in proc.stdout and "device bytes" not in proc.stdout


def test_host_access_can_be_allowed_and_then_reads_the_device_bytes():
    proc = run_host_access_script(NPU_SIM_HOST_ACCESS="1")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "protected: False" in proc.stdout and "device bytes: [0, 1, 2, 3]" in proc.stdout


# ---- pinned memory ----

def test_pinned_host_memory_comes_from_the_backend():
    assert npu_sim.supports_pinned_memory()
    before = npu_sim.pinned_bytes_allocated()
    pinned = torch.empty(256, dtype=torch.uint8, pin_memory=True)
    assert pinned.device.type == "cpu" and pinned.is_pinned()
    assert npu_sim.pinned_bytes_allocated() - before == 256
    assert npu_sim.device_of(pinned) is None  # host memory, not device memory
    source = torch.arange(16, dtype=torch.float32)
    assert not source.is_pinned()
    staged = source.pin_memory()
    assert staged.is_pinned() and torch.equal(staged, source) and staged.data_ptr() != source.data_ptr()
    on_device = staged.to("npu:1", non_blocking=True)  # queued on npu:1 (see test_npu_async.py)
    torch.npu.synchronize("npu:1")
    assert torch.equal(on_device.cpu(), source)
    del pinned, staged
    assert npu_sim.pinned_bytes_allocated() == before
    with pytest.raises(RuntimeError, match="Only dense CPU tensors can be pinned"):
        torch.empty(4, device="npu:0", pin_memory=True)


# ---- streams, events, other ops ----

def test_streams_and_events_with_nothing_queued_are_complete():
    torch.npu.synchronize()
    torch.npu.synchronize("npu:1")
    stream = torch.npu.Stream(1)
    assert stream.device == torch.device("npu:1") and stream.query()
    stream.synchronize()
    with torch.npu.stream(stream):
        assert torch.npu.current_device() == 1
    assert torch.npu.current_device() == 0
    assert torch.npu.current_stream().device == torch.device("npu:0")
    start, end = torch.npu.Event(enable_timing=True), torch.npu.Event(enable_timing=True)
    start.record()
    end.record(stream)
    end.synchronize()
    assert start.query() and end.query() and start.elapsed_time(end) >= 0


def test_other_ops_run_through_the_cpu_fallback_and_are_counted():
    t = torch.arange(6, dtype=torch.float32).to("npu:1")
    npu_sim.reset_copy_stats()
    result = t * 2 + 1
    assert result.device == torch.device("npu:1") and npu_sim.device_of(result) == 1
    assert torch.equal(result.cpu(), torch.arange(6, dtype=torch.float32) * 2 + 1)
    assert t.sum().item() == 15.0
    ops = npu_sim.fallback_ops()
    assert any(name.startswith("aten::mul") for name in ops) and any(name.startswith("aten::add") for name in ops)
    stats = npu_sim.copy_stats()
    assert stats["fallback"]["count"] > 0
    assert stats["d2h"]["count"] == 1  # only result.cpu(); the fallback's own copies are counted apart
    t.add_(1)  # in-place ops write back to the same device memory
    assert t.device == torch.device("npu:1") and torch.equal(t.cpu(), torch.arange(1.0, 7.0))
    assert torch.equal(torch.tensor([1, 2], device="npu:0").cpu(), torch.tensor([1, 2]))


def test_the_safetensors_device_resolver_sees_the_simulator():
    devices = pytest.importorskip("safetensors._devices", reason="the safetensors package is not built")
    assert devices.resolve_torch_device("npu:1") == torch.device("npu:1")
    assert devices.resolve_torch_device(torch.device("npu", 0)) == torch.device("npu:0")
    assert devices.resolve_torch_device(1) == torch.device("npu:1")  # an int names the current accelerator's device
    with pytest.raises(devices.SafetensorError, match=r"device npu:5 is not available: torch reports 2 'npu'"):
        devices.resolve_torch_device("npu:5")
