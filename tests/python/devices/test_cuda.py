"""Loading to and saving from CUDA devices: the NPU tests' mirror for NVIDIA GPUs (skipped without one).
Run on a GPU machine by scripts/gpu-check.sh."""

from __future__ import annotations

import pytest
import torch

from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, load_model, save, save_file, save_model

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device (see scripts/gpu-check.sh)")

DTYPES = [
    torch.float32, torch.float16, torch.bfloat16, torch.int8, torch.int64, torch.bool, torch.uint8,
    torch.float8_e4m3fn, torch.float8_e5m2, torch.complex64,
]


def raw(t: torch.Tensor) -> bytes:
    t = t.detach().to("cpu").contiguous()
    return t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""


def cuda_state() -> dict:
    out = {}
    for i, dtype in enumerate(DTYPES):
        g = torch.Generator().manual_seed(i)
        data = torch.randint(0, 256, (5, 8 * dtype.itemsize), dtype=torch.uint8, generator=g)
        if dtype == torch.bool:
            data %= 2
        out[str(dtype).removeprefix("torch.")] = data.view(dtype).to("cuda:0")
    out["empty"] = torch.zeros(0, 3, device="cuda:0")
    out["scalar"] = torch.tensor(7, dtype=torch.int64, device="cuda:0")
    return out


@pytest.mark.parametrize("backend", ["mmap", "pread", "direct", "auto"])
def test_round_trip_to_cuda(tmp_path, backend):
    state = cuda_state()
    path = tmp_path / "cuda.safetensors"
    save_file(state, path)
    assert path.read_bytes() == save({k: v.cpu() for k, v in state.items()})
    index = torch.cuda.device_count() - 1
    loaded = load_file(path, device=f"cuda:{index}", backend=backend)
    for name, t in loaded.items():
        assert t.device == torch.device("cuda", index) and raw(t) == raw(state[name]), name
    with safe_open(path, "pt", device="cuda:0", backend=backend) as f:
        assert raw(f.get_tensor("float32")) == raw(state["float32"])
        assert all(t.device.type == "cuda" for t in f.get_tensors().values())
        sl = f.get_slice("float32")[1:4, ::2]
        assert sl.device.type == "cuda" and torch.equal(sl.cpu(), state["float32"].cpu()[1:4, ::2])
    assert load_file(path, device=0)["int64"].device == torch.device("cuda", 0)


def test_load_model_to_cuda(tmp_path):
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 8))
    save_model(model, tmp_path / "m.safetensors")
    dst = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)).cuda()
    assert load_model(dst, tmp_path / "m.safetensors", device="cuda:0") == (set(), [])
    assert torch.equal(dst[0].weight.cpu(), model[0].weight)


@pytest.mark.parametrize("kind", [torch.nn.GRU, torch.nn.LSTM])
def test_save_model_of_an_rnn_flattened_by_cudnn(tmp_path, kind):
    # flatten_parameters packs the weights into one cuDNN buffer, each a view of it that covers none of it
    # (test_save_model_packed_parameters.py builds the same layout on the CPU).
    torch.manual_seed(0)
    model = kind(8, 16, num_layers=2, bidirectional=True).cuda()
    model.flatten_parameters()
    state = model.state_dict()
    if not torch.backends.cudnn.is_available() or len({t.untyped_storage().data_ptr() for t in state.values()}) != 1:
        pytest.skip("cuDNN did not pack the parameters into one buffer")
    save_model(model, tmp_path / "rnn.safetensors")
    fresh = kind(8, 16, num_layers=2, bidirectional=True)
    assert load_model(fresh, tmp_path / "rnn.safetensors") == (set(), [])
    for name, value in fresh.state_dict().items():
        assert torch.equal(value, state[name].cpu()), name


def test_device_memory_holds_only_the_tensors(tmp_path):
    state = {"big": torch.randn(40 * 2**20 // 4, generator=torch.Generator().manual_seed(0)), "small": torch.arange(1000)}
    save_file(state, tmp_path / "b.safetensors")
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated(0)
    loaded = load_file(tmp_path / "b.safetensors", device="cuda:0")
    nbytes = sum(t.numel() * t.element_size() for t in state.values())
    assert torch.cuda.memory_allocated(0) - before <= nbytes + 512 * len(state)
    assert all(torch.equal(loaded[k].cpu(), v) for k, v in state.items())


def test_default_device_context_is_ignored(tmp_path):
    save_file({"w": torch.arange(3)}, tmp_path / "w.safetensors")
    with torch.device("cuda:0"):
        assert load_file(tmp_path / "w.safetensors")["w"].device.type == "cpu"


def test_a_cuda_index_past_the_device_count_is_refused(tmp_path):
    save_file({"w": torch.zeros(1)}, tmp_path / "w.safetensors")
    with pytest.raises(SafetensorError, match="is not available"):
        load_file(tmp_path / "w.safetensors", device=f"cuda:{torch.cuda.device_count()}")
