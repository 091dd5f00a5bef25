"""Big-endian hosts, the parts a little-endian host can check: the host-order rule, the swap
helper, and that a code the host must swap is never handed out as a view of the file (it is read into memory
of its own). The values themselves are checked on a real big-endian Python: tests/big_endian/check_numpy.py
under qemu-s390x in scripts/test.d/60-big-endian.sh."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from safetensors import _core, _strategies, safe_open
from safetensors.numpy import save_file


def test_host_swaps_exactly_the_multi_byte_codes_on_big_endian_hosts() -> None:
    multi_byte = {code for code, row in _core.DTYPES.items() if row.swap_bytes}
    assert {"BF16", "F32", "C64", "U64"} <= multi_byte and not {"U8", "BOOL", "F8_E4M3", "F4"} & multi_byte
    assert _core.HOST_SWAPS == (multi_byte if sys.byteorder == "big" else frozenset())


def test_to_little_endian_swaps_each_unit_and_leaves_the_data(monkeypatch: pytest.MonkeyPatch) -> None:
    native = np.array([1, -2, 0x01020304], dtype=np.int32)
    data = native.tobytes()
    assert _core.to_little_endian(data, "I32") == native.astype("<i4").tobytes()
    # As a big-endian host sees it: each 4-byte unit reversed (C64: each 4-byte half), the input unchanged.
    monkeypatch.setattr(_core, "HOST_SWAPS", frozenset({"I32", "C64"}))
    assert _core.to_little_endian(data, "I32") == native.astype(">i4").tobytes()
    assert data == native.tobytes()
    c64 = np.array([1 - 2j], dtype=np.complex64)
    assert _core.to_little_endian(c64.tobytes(), "C64") == c64.astype(">c8").tobytes()
    assert _core.to_little_endian(b"\x01\x02", "U8") == b"\x01\x02"


def test_swapped_codes_are_read_into_owned_memory_not_viewed(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = str(tmp_path / "f.safetensors")
    save_file({"w": np.arange(6, dtype=np.float32), "b": np.arange(4, dtype=np.uint8)}, path)
    # Pretend the host swaps F32: on mmap it must take the read path (owned memory); U8 stays a view. (The
    # binding's DLPack views are refused in C++ by host_must_swap, which this host cannot pretend.)
    monkeypatch.setattr(_strategies, "HOST_SWAPS", frozenset({"F32"}))
    with safe_open(path, "np", backend="mmap") as f:
        w, b = f.get_tensor("w"), f.get_tensor("b")
        buffer = np.frombuffer(f._open().file.buffer(), dtype=np.uint8)
        all_w, all_b = f.get_tensors()["w"], f.get_tensors()["b"]
    inside = lambda a: buffer.ctypes.data <= a.ctypes.data < buffer.ctypes.data + buffer.size  # noqa: E731
    assert not inside(w) and not inside(all_w) and inside(b) and inside(all_b)
    assert w.tolist() == all_w.tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]


def test_distributed_loads_swap_each_tensor_once_after_its_bytes_arrived(tmp_path, monkeypatch) -> None:
    """The distributed loader moves the file's bytes between ranks as they are; on a big-endian host (here
    pretended through its HOST_SWAPS) each rank swaps its tensors once, whole tensors and row ranges alike."""
    torch = pytest.importorskip("torch")
    dist = pytest.importorskip("torch.distributed")
    from safetensors import distributed
    from safetensors.distributed import _moving
    from safetensors.torch import save_file as save_torch

    g = torch.Generator().manual_seed(15)
    tensors = {
        "f32": torch.randn(6, 5, generator=g),
        "c64": torch.randn(4, 3, generator=g, dtype=torch.complex64),
        "i16": torch.randint(-3000, 3000, (7,), generator=g, dtype=torch.int16),
        "u8": torch.randint(0, 255, (9,), generator=g, dtype=torch.uint8),
    }
    path = tmp_path / "be.safetensors"
    save_torch(tensors, str(path))
    widths = {"f32": 4, "c64": 4, "i16": 2}

    def swapped(t, width):
        units = t.reshape(-1).view(torch.uint8).view(-1, width).flip(1).contiguous()
        return units.view(-1).view(t.dtype).reshape(t.shape)

    monkeypatch.setattr(_moving, "HOST_SWAPS", frozenset({"F32", "C64", "I16"}))
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        whole = distributed.load_file(str(path))
        rows = distributed.load_file(str(path), plan={"f32": slice(2, 5), "i16": None})
    finally:
        dist.destroy_process_group()
    for name, t in tensors.items():
        want = swapped(t, widths[name]) if name in widths else t
        assert torch.equal(whole[name].view(torch.uint8), want.view(torch.uint8)), name
    assert torch.equal(rows["f32"].view(torch.uint8), swapped(tensors["f32"][2:5], 4).view(torch.uint8))
    assert torch.equal(rows["i16"].view(torch.uint8), swapped(tensors["i16"], 2).view(torch.uint8))
