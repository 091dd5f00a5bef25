"""Big-endian hosts (issue 15), the parts a little-endian host can check: the host-order rule, the swap
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
