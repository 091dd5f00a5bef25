"""Loading to and saving from Ascend NPU devices, against the simulated NPU of tests/python/npu_sim.

The simulator registers ``npu`` for the whole process (as importing torch_npu does), so when this file is
collected in a process without it, its tests run in a child pytest, reported by ``test_npu_in_a_child_process``.
"""

from __future__ import annotations


import pytest
import torch

import npu_sim
from safetensors import SafetensorError, safe_open
from safetensors.torch import load, load_file, load_model, save, save_file, save_model

DTYPES = [
    torch.float32, torch.float16, torch.bfloat16, torch.int8, torch.int64, torch.bool, torch.uint8,
    torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e8m0fnu, torch.float8_e4m3fnuz, torch.float8_e5m2fnuz,
    torch.complex64, torch.uint16, torch.float4_e2m1fn_x2,
]
BACKENDS = ["mmap", "pread", "direct", "auto"]


@pytest.fixture(autouse=True)
def _npu(request):
    npu_sim.enter_test(request, "test_npu_in_a_child_process")
    yield


def test_npu_in_a_child_process():
    npu_sim.run_file_in_child(__file__, 14)


def raw(t: torch.Tensor) -> bytes:
    t = t.detach().to("cpu").contiguous()
    return t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""


def npu_state(device: str = "npu:0") -> dict:
    """Tensors of every dtype with random bit patterns, living on ``device``."""
    out = {}
    for i, dtype in enumerate(DTYPES):
        g = torch.Generator().manual_seed(i)
        data = torch.randint(0, 256, (5, 8 * dtype.itemsize), dtype=torch.uint8, generator=g)
        if dtype == torch.bool:
            data %= 2
        out[str(dtype).removeprefix("torch.")] = data.view(dtype).to(device)
    out["empty"] = torch.zeros(0, 3, device=device)
    out["scalar"] = torch.tensor(7, dtype=torch.int64).to(device)
    return out


def assert_on(tensors: dict, expected: dict, index: int) -> None:
    assert sorted(tensors) == sorted(expected)
    for name, t in tensors.items():
        assert t.device == torch.device("npu", index), name
        if t.numel():
            assert npu_sim.device_of(t) == index, name  # the bytes live in that device's memory
        assert t.dtype == expected[name].dtype and t.shape == expected[name].shape, name
        assert raw(t) == raw(expected[name]), name


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("index", [0, 1])
def test_saved_from_npu0_loaded_to_each_npu(tmp_path, backend, index):
    state = npu_state("npu:0")
    path = tmp_path / "npu.safetensors"
    save_file(state, path)
    assert path.read_bytes() == save({k: v.cpu() for k, v in state.items()})  # copied to CPU, then written
    loaded = load_file(path, device=f"npu:{index}", backend=backend)
    assert_on(loaded, state, index)
    with safe_open(path, "pt", device=f"npu:{index}", backend=backend) as f:
        assert_on({"float32": f.get_tensor("float32")}, {"float32": state["float32"]}, index)
        assert_on(f.get_tensors(), state, index)
        sl = f.get_slice("float32")[1:4, ::2]
        assert sl.device == torch.device("npu", index) and npu_sim.device_of(sl) == index
        assert torch.equal(sl.cpu(), state["float32"].cpu()[1:4, ::2])
        assert torch.equal(f.get_slice("int64")[-1].cpu(), state["int64"].cpu()[-1])


@pytest.mark.parametrize(
    "device, index", [("npu", 0), ("npu:1", 1), ("torch.device('npu', 1)", 1), (1, 1), (0, 0)]
)
def test_device_forms(tmp_path, device, index):
    if isinstance(device, str) and device.startswith("torch.device"):
        device = torch.device("npu", 1)  # built here: "npu" parses only once the simulator is installed
    save_file({"w": torch.arange(6.0)}, tmp_path / "w.safetensors")
    t = load_file(tmp_path / "w.safetensors", device=device)["w"]
    assert t.device == torch.device("npu", index) and torch.equal(t.cpu(), torch.arange(6.0))


def test_bad_npu_index_is_a_clear_error(tmp_path):
    save_file({"w": torch.zeros(1)}, tmp_path / "w.safetensors")
    with pytest.raises(SafetensorError, match=r"device npu:5 is not available: torch reports 2 'npu' device\(s\)"):
        load_file(tmp_path / "w.safetensors", device="npu:5")


def test_load_model_to_npu(tmp_path):
    class Tied(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Linear(4, 4)
            self.b = torch.nn.Linear(4, 4)
            self.b.weight = self.a.weight

    src = Tied()
    save_model(src, tmp_path / "m.safetensors")
    dst = Tied().to("npu:1")
    dst.b.weight = dst.a.weight  # Module.to() on a PrivateUse1 backend makes new Parameters: tie again
    assert load_model(dst, tmp_path / "m.safetensors", device="npu:1") == (set(), [])
    assert dst.a.weight.device == torch.device("npu", 1) and dst.b.weight is dst.a.weight
    assert torch.equal(dst.a.weight.cpu(), src.a.weight) and torch.equal(dst.b.bias.cpu(), src.b.bias)


@pytest.fixture
def small_staging():
    """The engine's process-wide slab pool capped at 32 MiB (four 8 MiB slabs) for one test."""
    from safetensors import _engine

    _engine.set_staging_capacity(32 * 2**20)
    _engine._cpp.engine.slab_pool_set_slab_bytes(8 * 2**20)
    yield _engine
    _engine.set_staging_capacity(256 * 2**20)


def test_staging_is_pinned_bounded_and_overlapped(tmp_path, small_staging):
    """A file larger than the staging pool: every byte reaches the device through page-locked slabs of the
    engine's pool, never more than its capacity at once, with asynchronous copies; device memory holds just
    the tensors, and the pinned memory is returned once no load runs."""
    g = torch.Generator().manual_seed(0)
    state = {"big": torch.randn(50 * 2**20 // 4, generator=g), "small": torch.arange(100),
             "other": torch.randn(25 * 2**20 // 4, generator=g)}
    path = tmp_path / "big.safetensors"
    save_file(state, path)
    nbytes = sum(t.numel() * t.element_size() for t in state.values())
    before_device = npu_sim.bytes_allocated(1)
    small_staging.reset_staging_peak()
    loaded = load_file(path, device="npu:1", backend="pread")
    assert all(torch.equal(loaded[k].cpu(), v) for k, v in state.items())
    stats = npu_sim.copy_stats()
    assert stats["h2d"]["bytes"] == nbytes  # each byte crossed once
    assert stats["h2d"]["count"] == stats["non_blocking"] >= 10  # asynchronous copies from pinned slabs
    pool = small_staging.staging_stats()
    assert 0 < pool["peak_bytes"] <= 32 * 2**20
    assert npu_sim.supports_pinned_memory() and npu_sim.pinned_bytes_allocated() == 0  # returned when idle
    assert npu_sim.bytes_allocated(1) - before_device <= nbytes + 4096 * len(state)
    assert not npu_sim.fallback_ops()


def test_eight_concurrent_loads_share_one_bounded_pool(tmp_path, small_staging):
    """Eight threads loading at once (both devices): the pinned memory the simulator counts never exceeds
    the pool's capacity, every load is exact, and all of it is returned afterwards."""
    import threading

    g = torch.Generator().manual_seed(1)
    state = {f"t{i}": torch.randn(3 * 2**20 // 4, generator=g) for i in range(6)}  # 18 MiB
    path = tmp_path / "m.safetensors"
    save_file(state, path)
    peak = [0]
    stop = threading.Event()

    def watch():
        while not stop.is_set():
            peak[0] = max(peak[0], npu_sim.pinned_bytes_allocated())

    results, errors = {}, []

    def load(i):
        try:
            results[i] = load_file(path, device=f"npu:{i % 2}")
        except BaseException as e:  # reported below
            errors.append(e)

    small_staging.reset_staging_peak()
    watcher = threading.Thread(target=watch)
    watcher.start()
    threads = [threading.Thread(target=load, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stop.set()
    watcher.join()
    assert not errors, errors
    for i, loaded in results.items():
        assert all(torch.equal(loaded[k].cpu(), v) for k, v in state.items()), i
    assert 0 < small_staging.staging_stats()["peak_bytes"] <= 32 * 2**20
    assert peak[0] <= 32 * 2**20
    assert npu_sim.pinned_bytes_allocated() == 0


@pytest.mark.parametrize("backend", BACKENDS)
def test_row_slices_onto_the_npu_stream_through_the_engine(tmp_path, backend):
    """get_slice(...)[rows] onto an accelerator is one byte range: it goes through the engine's pinned slabs
    with non-blocking copies, and only those bytes cross; other selections are read on the CPU and moved."""
    g = torch.Generator().manual_seed(4)
    w = torch.randn(64, 1024, generator=g)
    v = torch.arange(10)
    path = tmp_path / "rows.safetensors"
    save_file({"w": w, "v": v}, path)
    with safe_open(path, "pt", device="npu:1", backend=backend) as f:
        npu_sim.reset_copy_stats()
        rows = f.get_slice("w")[10:20]
        assert rows.device == torch.device("npu", 1) and npu_sim.device_of(rows) == 1
        assert torch.equal(rows.cpu(), w[10:20])
        stats = npu_sim.copy_stats()
        assert stats["h2d"]["bytes"] == 10 * 1024 * 4 and stats["non_blocking"] >= 1
        one = f.get_slice("w")[-3]
        assert one.shape == (1024,) and torch.equal(one.cpu(), w[-3])
        assert torch.equal(f.get_slice("w")[10:20, :].cpu(), w[10:20])
        assert f.get_slice("w")[5:2].shape == (0, 1024)
        assert torch.equal(f.get_slice("v")[3:].cpu(), v[3:])
        npu_sim.reset_copy_stats()
        assert torch.equal(f.get_slice("w")[::2, 3].cpu(), w[::2, 3])  # not rows: CPU read, then moved
        assert npu_sim.copy_stats()["non_blocking"] == 0
        with pytest.raises(SafetensorError):
            f.get_slice("w")[64]
    assert not npu_sim.fallback_ops()


@pytest.mark.parametrize("backend", BACKENDS)
def test_strided_selections_within_rows_stream_the_rows_and_select_on_the_npu(tmp_path, backend):
    """A selection whose rows are one step-1 range of the first dimension (or all of it, behind an Ellipsis)
    streams those rows' bytes through the engine and selects the rest on the device: equal to the CPU result,
    and only the rows' bytes cross. Negative steps (torch cannot index them) and strided rows are read on the
    CPU and moved."""
    g = torch.Generator().manual_seed(9)
    w = torch.randn(40, 24, 6, generator=g)
    m = torch.arange(60 * 50, dtype=torch.int32).reshape(60, 50)
    path = tmp_path / "strided.safetensors"
    save_file({"w": w, "m": m}, path)
    row_bytes = {"w": 24 * 6 * 4, "m": 50 * 4}
    cases = [  # (tensor, index, rows streamed)
        ("m", (slice(10, 20), 3), 10),
        ("m", (slice(10, 20), slice(None, None, 3)), 10),
        ("m", (-5, slice(7, 40, 7)), 1),
        ("m", (Ellipsis, 3), 60),
        ("m", (slice(50, 100), slice(1, 2)), 10),
        ("w", (slice(3, 9), Ellipsis, slice(1, 5)), 6),
        ("w", (slice(2, 4), 1, slice(None, None, 2)), 2),
        ("w", (7, slice(20, 2, 1), 0), 1),  # an empty inner range
        ("w", (slice(30, 31), slice(None), slice(None)), 1),
    ]
    with safe_open(path, "pt", backend=backend) as cpu, safe_open(path, "pt", device="npu:1", backend=backend) as f:
        for name, index, rows in cases:
            want = cpu.get_slice(name)[index]
            npu_sim.reset_copy_stats()
            got = f.get_slice(name)[index]
            stats = npu_sim.copy_stats()
            assert got.device == torch.device("npu", 1) and npu_sim.device_of(got) in (1, None), index
            assert got.shape == want.shape and got.dtype == want.dtype, index
            assert torch.equal(got.cpu(), want), index
            assert got.is_contiguous(), index
            assert stats["h2d"]["bytes"] == rows * row_bytes[name] and stats["non_blocking"] >= 1, index
        for name, index in [("m", (slice(10, 20), slice(None, None, -2))), ("m", (slice(None, None, 2), 3))]:
            npu_sim.reset_copy_stats()
            got = f.get_slice(name)[index]
            assert torch.equal(got.cpu(), cpu.get_slice(name)[index]), index
            assert npu_sim.copy_stats()["non_blocking"] == 0, index  # read on the CPU, then moved
        with pytest.raises(SafetensorError) as on_cpu:  # the slicer's checks, before anything is streamed
            cpu.get_slice("m")[3:5, 50]
        npu_sim.reset_copy_stats()
        with pytest.raises(SafetensorError) as on_npu:
            f.get_slice("m")[3:5, 50]
        assert str(on_npu.value) == str(on_cpu.value) and npu_sim.copy_stats()["h2d"]["count"] == 0
    assert not npu_sim.fallback_ops()


def test_default_device_context_is_ignored(tmp_path):
    save_file({"w": torch.arange(3)}, tmp_path / "w.safetensors")
    with torch.device("npu:1"):
        assert load_file(tmp_path / "w.safetensors")["w"].device.type == "cpu"
        assert load(save({"w": torch.arange(3, device="cpu")}))["w"].device.type == "cpu"


def test_meta_and_save_of_mixed_devices(tmp_path):
    state = {"on_npu": torch.arange(4.0).to("npu:1"), "on_cpu": torch.ones(2)}
    save_file(state, tmp_path / "mixed.safetensors")
    back = load_file(tmp_path / "mixed.safetensors")
    assert torch.equal(back["on_npu"], torch.arange(4.0)) and torch.equal(back["on_cpu"], torch.ones(2))
    meta = load_file(tmp_path / "mixed.safetensors", device="meta")
    assert meta["on_npu"].device.type == "meta" and npu_sim.copy_stats()["h2d"]["count"] == 1
