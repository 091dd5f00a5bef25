"""safe_open.prefetch onto the simulated Ascend NPU (tests/python/npu_sim): where the reference refuses every
device but CUDA, ours loads to ``npu:N`` with the same semantics as on the CPU (test_prefetch.py).

Like test_npu.py, the simulator changes the whole process, so in a process without it these tests run in a
child pytest, reported by ``test_prefetch_npu_in_a_child_process``."""

from __future__ import annotations

import os
import re
import threading

import pytest
import torch

import npu_sim
from safetensors import SafetensorError, safe_open
from safetensors import _safetensors_cpp as _cpp
from safetensors.torch import save_file


@pytest.fixture(autouse=True)
def _npu(request):
    npu_sim.enter_test(request, "test_prefetch_npu_in_a_child_process")
    yield


def test_prefetch_npu_in_a_child_process():
    npu_sim.run_file_in_child(__file__, 5)


def raw(t: torch.Tensor) -> bytes:
    t = t.detach().to("cpu").contiguous()
    return t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""


@pytest.fixture
def path(tmp_path):
    g = torch.Generator().manual_seed(3)
    p = tmp_path / "model.safetensors"
    save_file({
        "embed": torch.randn(300, 64, generator=g),
        "big": torch.randn(80 * 2**20 // 4, generator=g),  # more than one staging buffer (64 MiB)
        "ids": torch.arange(1000),
        "half": torch.randn(16, 8, generator=g).to(torch.bfloat16),
        "fp8": torch.randn(32, generator=g).to(torch.float8_e4m3fn),
    }, p)
    return p


@pytest.mark.parametrize("backend", ["mmap", "pread"])
@pytest.mark.parametrize("device", ["npu:0", "npu:1"])
def test_whole_file_lands_on_the_device(path, backend, device):
    with safe_open(path, "pt", backend=backend) as f:
        expected = {n: f.get_tensor(n) for n in f.keys()}
        with f.prefetch(device=device) as loader:
            got = dict(loader)
    assert got.keys() == expected.keys()
    for name, tensor in got.items():
        assert tensor.device == torch.device(device), name
        assert npu_sim.device_of(tensor) == torch.device(device).index
        assert raw(tensor) == raw(expected[name]), name


def test_handle_device_is_the_default_and_rows_come_back_as_rows(tmp_path, path):
    with safe_open(path, "pt", device="npu:1") as f:
        cpu = safe_open(path, "pt")
        with f.prefetch({"embed": slice(10, 20), "ids": slice(-5, None)}) as loader:
            embed = loader.take("embed")
            ids = loader.take("ids")
    assert embed.device == torch.device("npu:1") and embed.shape == (10, 64)
    assert raw(embed) == raw(cpu.get_tensor("embed")[10:20])
    assert raw(ids) == raw(cpu.get_tensor("ids")[-5:])


def test_a_box_of_an_inner_dimension_lands_on_the_device(path):
    with safe_open(path, "pt", device="npu:1") as f, safe_open(path, "pt") as cpu:
        with f.prefetch({"embed": (slice(100, 200), slice(16, 48)), "half": (slice(None), slice(0, 4))}) as loader:
            got = dict(loader)
        for name, box in [("embed", (slice(100, 200), slice(16, 48))), ("half", (slice(None), slice(0, 4)))]:
            assert got[name].device == torch.device("npu:1")
            assert raw(got[name]) == raw(cpu.get_slice(name)[box]), name


def test_a_truncated_file_raises_naming_file_and_tensor(path):
    data_offset = _cpp.File(str(path), "pread").data_offset
    with safe_open(path, "pt", backend="pread") as f:
        # Cut 4 KiB into "big" (80 MiB, staged through more than one buffer): its reads fail.
        os.truncate(path, data_offset + f.get_tensor_meta("big").data_offsets[0] + 4096)
        with f.prefetch({"big": None}, device="npu:0") as loader:
            with pytest.raises(OSError, match=r"shorter than expected.*read of tensor `big`.*" + re.escape(str(path))):
                loader.take("big")


def test_two_loaders_on_two_devices_at_once(path):
    with safe_open(path, "pt") as f:
        expected = raw(f.get_tensor("big"))
        a = f.prefetch({"big": None}, device="npu:0")
        b = f.prefetch({"big": None}, device=1)
        results = {}
        threads = [threading.Thread(target=lambda k, ld: results.__setitem__(k, ld.take("big")), args=(k, ld))
                   for k, ld in (("a", a), ("b", b))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        a.close()
        b.close()
    assert results["a"].device == torch.device("npu:0") and results["b"].device == torch.device("npu:1")
    assert raw(results["a"]) == expected and raw(results["b"]) == expected


def test_plan_errors_come_before_any_device_work(path):
    before = npu_sim.bytes_allocated(0)
    with safe_open(path, "pt", device="npu:0") as f:
        with pytest.raises(SafetensorError, match="out of range"):
            f.prefetch({"embed": slice(0, 301)})
    assert npu_sim.bytes_allocated(0) == before


def test_a_remote_file_lands_on_the_device(path):
    """A checkpoint behind an http:// URL (a Range server on 127.0.0.1): prefetch, get_tensor and load_file
    onto npu:1 give the local file's bytes, fetched once through the engine's bounded slabs."""
    from remote.range_server import RangeServer, overlaps
    from safetensors.torch import load_file

    with RangeServer() as server:
        server.put("/model.safetensors", path)
        url = server.url("/model.safetensors")
        expected = load_file(path)
        with safe_open(url, "pt", device="npu:1") as f:
            with f.prefetch() as loader:
                got = dict(loader)
            stats = f._open().file.source_stats()
        assert got.keys() == expected.keys()
        for name, tensor in got.items():
            assert npu_sim.device_of(tensor) == 1
            assert raw(tensor) == raw(expected[name]), name
        assert overlaps(server.spans("/model.safetensors")) == []
        assert stats["bytes_fetched"] == path.stat().st_size
        for name, tensor in load_file(url, device="npu:0").items():
            assert npu_sim.device_of(tensor) == 0 and raw(tensor) == raw(expected[name]), name
        with safe_open(url, "pt", device="npu:0") as f:
            assert raw(f.get_slice("embed")[5:9]) == raw(expected["embed"][5:9])
