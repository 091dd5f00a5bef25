"""safetensors.paddle: the shared framework contract, plus paddle's devices, save checks and zero-copy loads."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any, List, Tuple

import numpy as np
import pytest

paddle = pytest.importorskip(
    "paddle", reason="paddlepaddle is not installed (pip install -r requirements-frameworks.txt)"
)

import safetensors.paddle as st_paddle  # noqa: E402
from safetensors import SafetensorError, safe_open  # noqa: E402
from test_frameworks_common import FrameworkContract, sample  # noqa: E402


class TestPaddle(FrameworkContract):
    framework = "paddle"
    display_name = "paddle"
    module = st_paddle
    module_name = "safetensors.paddle"
    codes = frozenset(["BOOL", "U8", "I8", "I16", "I32", "U32", "I64", "U64", "F16", "BF16", "F32", "F64", "C64",
                       "F8_E4M3", "F8_E5M2"])
    # The reference has no size for uint32/uint64 paddle tensors when saving, and cannot reshape them on load.
    reference_save_codes = codes - {"U32", "U64"}
    reference_load_codes = codes - {"U32", "U64"}
    reference_handles_empty = False  # its paddle loader fails on zero-size tensors
    SETUP = """
import contextlib
import ctypes
import numpy as np
import paddle
from paddle.utils.dlpack import from_dlpack

def make(a):
    name = a.dtype.name
    if name == "bfloat16":
        return paddle.to_tensor(a.view(np.uint16))  # to_tensor reads uint16 as bfloat16
    if name.startswith("float8"):
        return paddle.to_tensor(a.view(np.uint8)).view(getattr(paddle, name))
    if name in ("uint32", "uint64"):
        return from_dlpack(a.copy())  # to_tensor refuses them
    return paddle.to_tensor(a)

def dump(t):
    t = t if t.is_contiguous() else t.contiguous()  # the reference's slices can be strided views
    n = int(np.prod(t.shape, dtype=np.int64)) * t.element_size()
    return (str(t.dtype), tuple(t.shape), ctypes.string_at(t.data_ptr(), n) if n else b"")

CONTEXTS = [contextlib.nullcontext]
"""

    # Paddle takes devices: the device tests below replace the contract's refusal test.
    test_non_cpu_devices_are_refused_like_the_reference = None  # type: ignore[assignment]


# -- devices ---------------------------------------------------------------------------------------------------

@pytest.fixture
def f32_file(tmp_path: Path) -> Path:
    path = tmp_path / "d.safetensors"
    st_paddle.save_file({"t": paddle.to_tensor(sample("F32", (3, 2), 70))}, path)
    return path


@pytest.mark.parametrize("device", ["cpu", paddle.CPUPlace()])
def test_cpu_devices(device: Any, f32_file: Path) -> None:
    for loaded in (st_paddle.load_file(f32_file, device=device)["t"],
                   st_paddle.load(f32_file.read_bytes(), device=device)["t"]):
        assert loaded.place.is_cpu_place()
        assert loaded.numpy().tobytes() == sample("F32", (3, 2), 70).tobytes()


@pytest.mark.skipif(paddle.is_compiled_with_cuda(), reason="this paddle has CUDA")
@pytest.mark.parametrize("device", ["cuda", "cuda:0", "gpu", "gpu:1", "dcu:0"])
def test_gpu_devices_need_a_cuda_build(device: str, f32_file: Path) -> None:
    with pytest.raises(SafetensorError, match=f"^device {device} is not available: paddle reports 0 'gpu' device"):
        st_paddle.load_file(f32_file, device=device)
    with pytest.raises(SafetensorError, match=f"^device {device} is not available"):
        st_paddle.load(f32_file.read_bytes(), device=device)


@pytest.mark.parametrize("device", ["npu", "npu:0", "mlu:1"])
def test_custom_devices_need_their_plugin(device: str, f32_file: Path) -> None:
    if device.split(":")[0] in (paddle.device.get_all_custom_device_type() or []):
        pytest.skip(f"a plugin for {device} is installed")
    with pytest.raises(SafetensorError, match=f"^device {device} is not available: paddle has no '"):
        safe_open(f32_file, framework="paddle", device=device)


@pytest.mark.parametrize(
    ("device", "error", "message"),
    [
        ("mps", SafetensorError, "^Device mps is not supported for framework paddle$"),
        ("xla:0", SafetensorError, "^Device xla:0 is not supported for framework paddle$"),
        ("foo", SafetensorError, "^device foo is invalid$"),
        ("cpu:0", SafetensorError, "^device cpu:0 is invalid$"),
        (-1, SafetensorError, "^device -1 is invalid$"),
        (True, SafetensorError, "^device True is invalid$"),
        (None, SafetensorError, "^device None is invalid$"),
        ("cuda:x", ValueError, "invalid device index"),
    ],
)
def test_bad_devices(device: Any, error: type, message: str, f32_file: Path) -> None:
    with pytest.raises(error, match=message):
        safe_open(f32_file, framework="paddle", device=device)


@pytest.mark.skipif(paddle.is_compiled_with_cuda() or paddle.is_compiled_with_xpu(), reason="paddle has an accelerator")
def test_an_int_device_needs_an_accelerator(f32_file: Path) -> None:
    if paddle.device.get_available_custom_device():
        pytest.skip("a custom device is available")
    with pytest.raises(SafetensorError, match="^device 0 is invalid: .*paddle reports no accelerator"):
        st_paddle.load_file(f32_file, device=0)


class _FakePlace:
    """Stands in for paddle.CustomPlace, which cannot be built without the device's plugin."""

    def __init__(self, kind: str, index: int) -> None:
        self.kind, self.index = kind, index

    def is_cpu_place(self) -> bool:
        return False

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _FakePlace) and (self.kind, self.index) == (other.kind, other.index)

    def __repr__(self) -> str:
        return f"Place({self.kind}:{self.index})"


@pytest.fixture
def fake_npus(monkeypatch: pytest.MonkeyPatch) -> List[Tuple[Any, Any]]:
    """Paddle as it looks with a two-card 'npu' plugin whose current card is npu:1; records every copy."""
    moves: List[Tuple[Any, Any]] = []
    monkeypatch.setattr(paddle.device, "get_all_custom_device_type", lambda: ["npu"])
    monkeypatch.setattr(paddle.device, "get_available_custom_device", lambda: ["npu:0", "npu:1"])
    monkeypatch.setattr(paddle.device, "get_device", lambda *a: "npu:1")
    monkeypatch.setattr(paddle, "CustomPlace", _FakePlace)

    def to(self: Any, device: Any = None, **kwargs: Any) -> Any:
        moves.append((tuple(self.shape), device))
        return self

    monkeypatch.setattr(paddle.Tensor, "to", to)
    return moves


def test_custom_devices_resolve_to_their_place(fake_npus: List[Tuple[Any, Any]]) -> None:
    assert st_paddle.FRAMEWORK.resolve_device("npu") == _FakePlace("npu", 1)  # the current card
    assert st_paddle.FRAMEWORK.resolve_device("npu:0") == _FakePlace("npu", 0)
    assert st_paddle.FRAMEWORK.resolve_device(0) == _FakePlace("npu", 0)
    with pytest.raises(SafetensorError, match="^device npu:2 is not available: paddle reports 2 'npu' device"):
        st_paddle.FRAMEWORK.resolve_device("npu:2")


@pytest.mark.parametrize("backend", ["mmap", "pread"])
def test_tensors_go_to_a_custom_device_through_the_engine(
    backend: str, f32_file: Path, fake_npus: List[Tuple[Any, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Whole tensors stream through the loading engine onto the place (test_paddle_engine.py runs that path on
    # the CPU); here the engine's load runs onto the CPU and records the place it was asked for.
    staged: List[Tuple[List[str], Any]] = []
    staged_load = st_paddle._staged_load

    def recording(file: Any, infos: List[Any], place: Any) -> Any:
        staged.append(([name for name, _ in infos], place))
        return staged_load(file, infos, paddle.CPUPlace())

    monkeypatch.setattr(st_paddle, "_staged_load", recording)
    loaded = st_paddle.load_file(f32_file, device="npu:1", backend=backend)
    assert staged == [(["t"], _FakePlace("npu", 1))] and fake_npus == []
    assert loaded["t"].numpy().tobytes() == sample("F32", (3, 2), 70).tobytes()
    with safe_open(f32_file, framework="paddle", device="npu:0", backend=backend) as f:
        assert f.get_tensor("t").numpy().tobytes() == sample("F32", (3, 2), 70).tobytes()
        assert staged[-1] == (["t"], _FakePlace("npu", 0))
        f.get_slice("t")[1:]  # slices are read on the CPU and moved
    assert fake_npus == [((2, 2), _FakePlace("npu", 0))]
    st_paddle.load(f32_file.read_bytes(), device="npu")
    assert staged[-1] == (["t"], _FakePlace("npu", 1))


# -- zero copy and lifetimes ----------------------------------------------------------------------------------------

def test_mmap_tensors_are_views_of_one_private_mapping(tmp_path: Path) -> None:
    path = tmp_path / "v.safetensors"
    st_paddle.save_file({"t": paddle.to_tensor(np.zeros(4, np.float32))}, path)
    before = path.read_bytes()
    with safe_open(path, framework="paddle", backend="mmap") as f:
        a, b = f.get_tensor("t"), f.get_tensor("t")
    a[1] = 5.0
    assert b.numpy().tolist() == [0.0, 5.0, 0.0, 0.0]  # the same memory
    assert path.read_bytes() == before  # copy-on-write: the file is untouched
    with safe_open(path, framework="paddle", backend="pread") as f:
        c, d = f.get_tensor("t"), f.get_tensor("t")
    c[1] = 5.0
    assert d.numpy().tolist() == [0.0, 0.0, 0.0, 0.0]


def test_the_interpreter_exits_cleanly_after_loading(tmp_path: Path) -> None:
    """The reference's paddle tensors abort the interpreter at exit; ours must not."""
    path = tmp_path / "x.safetensors"
    st_paddle.save_file({"a": paddle.to_tensor(sample("F32", (8, 4), 71)), "b": paddle.to_tensor(np.arange(3))}, path)
    script = textwrap.dedent(
        f"""
        import gc
        import safetensors.paddle as sp
        from safetensors import safe_open
        kept = [sp.load_file({str(path)!r}), sp.load_file({str(path)!r}, backend="pread")]
        with safe_open({str(path)!r}, framework="paddle") as f:
            kept.append(f.get_slice("a")[::2])
        dropped = sp.load_file({str(path)!r})
        del dropped
        gc.collect()
        print(float(kept[0]["a"].sum()) == float(kept[1]["a"].sum()), list(kept[2].shape))
        """
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split("\n")[-2] == "True [4, 4]"


# -- saving ---------------------------------------------------------------------------------------------------------

def test_save_checks_in_the_references_order() -> None:
    with pytest.raises(ValueError, match=r"^Expected a dict of \[str, paddle.Tensor\] but received <class 'list'>$"):
        st_paddle.save([])
    good = paddle.to_tensor(np.arange(6, dtype=np.float32).reshape(2, 3))
    message = "^Key `n` is invalid, expected paddle.Tensor but received <class 'numpy.ndarray'>$"
    with pytest.raises(ValueError, match=message):
        st_paddle.save({"t": good.transpose([1, 0]), "n": np.zeros(2)})
    with pytest.raises(ValueError, match="^You are trying to save a non contiguous tensor: `t` which is not allowed"):
        st_paddle.save({"ok": good, "t": good.transpose([1, 0])})
    assert st_paddle.load(st_paddle.save({"t": good.transpose([1, 0]).contiguous()}))["t"].numpy().tolist() == [
        [0.0, 3.0], [1.0, 4.0], [2.0, 5.0]
    ]


def test_u16_files_raise_instead_of_loading_as_bfloat16(tmp_path: Path) -> None:
    from safetensors.numpy import save_file as numpy_save_file

    numpy_save_file({"t": np.arange(4, dtype=np.uint16)}, tmp_path / "u16.safetensors")
    with pytest.raises(SafetensorError, match=r"^dtype U16 has no paddle equivalent \(paddle.uint16 is an alias"):
        st_paddle.load_file(tmp_path / "u16.safetensors")


def test_parameters_save_like_tensors() -> None:
    layer = paddle.nn.Linear(3, 2)
    data = st_paddle.save({"w": layer.weight, "b": layer.bias})
    loaded = st_paddle.load(data)
    assert loaded["w"].numpy().tobytes() == layer.weight.numpy().tobytes()
    assert loaded["b"].numpy().tobytes() == layer.bias.numpy().tobytes()
