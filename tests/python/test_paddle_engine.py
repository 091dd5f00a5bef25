"""Paddle loads through the loading engine (the path GPU and custom-device loads take), run on the CPU.

``safetensors.paddle._STAGE_CPU`` sends CPU loads down the staged path: reader threads into slabs of the
process-wide pool, paddle copies out of each slab into the destination's bytes, the slab recycled after its
copy. Slabs here are 4 KiB and the pool holds four, so tensors span slabs, slabs hold several tensors, and
slabs are reused many times within one load. Every result is compared byte for byte with the plain load.
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path
from typing import Any, Dict, Iterator, List, Tuple

import numpy as np
import pytest

paddle = pytest.importorskip(
    "paddle", reason="paddlepaddle is not installed (pip install -r requirements-frameworks.txt)"
)

import safetensors.paddle as st_paddle  # noqa: E402
from safetensors import _engine, safe_open  # noqa: E402
from safetensors.numpy import save_file as numpy_save_file  # noqa: E402
from test_frameworks_common import ALL_CODES, sample  # noqa: E402

SLAB = 4096
# Shapes per code: one spanning several slabs, one smaller than a slab, a scalar, an empty tensor.
SHAPES = [(37, 53), (3, 5), (), (0, 4)]
PADDLE_CODES = [code for code in ALL_CODES if code in st_paddle._ADAPTER.codes]


def _dump(tensor: Any) -> Tuple[str, Tuple[int, ...], bytes]:
    nbytes = int(np.prod(tensor.shape, dtype=np.int64)) * tensor.element_size()
    return str(tensor.dtype), tuple(tensor.shape), ctypes.string_at(tensor.data_ptr(), nbytes) if nbytes else b""


@pytest.fixture
def staged(monkeypatch: pytest.MonkeyPatch) -> Iterator[Dict[str, Any]]:
    """CPU loads through the engine, with small slabs; counts copies and the slabs paddle's allocator made."""
    counts: Dict[str, Any] = {"copies": 0, "live": {}, "allocations": 0}
    allocate, copy = st_paddle._PaddleCopier.allocate, st_paddle._PaddleCopier.copy

    def counting_allocate(size: int) -> Tuple[int, Any]:
        address, owner = allocate(size)
        counts["live"][address] = size
        counts["allocations"] += 1
        return address, owner

    def counting_copy(self: Any, *args: Any) -> None:
        counts["copies"] += 1
        copy(self, *args)

    def counting_free(address: int, size: int) -> None:
        counts["live"].pop(address, None)
        free(address, size)

    free = _engine._free
    monkeypatch.setattr(st_paddle, "_STAGE_CPU", True)
    monkeypatch.setattr(st_paddle._PaddleCopier, "allocate", staticmethod(counting_allocate))
    monkeypatch.setattr(st_paddle._PaddleCopier, "copy", counting_copy)
    monkeypatch.setattr(_engine, "_free", counting_free)
    _engine._allocator_framework = None  # the next load installs the counting allocator
    _engine._cpp.slab_pool_set_slab_bytes(SLAB)
    _engine.set_staging_capacity(4 * SLAB)
    try:
        yield counts
    finally:
        _engine.set_staging_capacity(256 << 20)
        _engine._cpp.slab_pool_set_slab_bytes(8 << 20)
        _engine._cpp.slab_pool_set_allocator()
        _engine._allocator_framework = None  # the next load, of any framework, installs its own again


def _returned(counts: Dict[str, Any]) -> None:
    """Every slab went back to the pool and the pool returned its memory: nothing is held after a load."""
    stats = _engine.staging_stats()
    assert stats["slabs_in_use"] == 0
    assert stats["allocated_bytes"] == 0
    assert counts["allocations"] > 0 and counts["live"] == {}


@pytest.fixture(scope="module")
def every_dtype(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("paddle_engine") / "all.safetensors"
    tensors = {
        f"{code}_{i}": sample(code, shape, seed=10 * ALL_CODES.index(code) + i)
        for code in PADDLE_CODES for i, shape in enumerate(SHAPES)
    }
    numpy_save_file(tensors, path)
    return path


def _plain(path: Path, backend: str) -> Dict[str, Tuple[str, Tuple[int, ...], bytes]]:
    assert not st_paddle._STAGE_CPU
    return {name: _dump(t) for name, t in st_paddle.load_file(path, backend=backend).items()}


@pytest.mark.parametrize("backend", ["mmap", "pread"])
def test_every_dtype_through_the_engine_equals_the_plain_load(
    backend: str, every_dtype: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> None:
    expected = _plain(every_dtype, backend)
    assert sorted(expected) == sorted(f"{c}_{i}" for c in PADDLE_CODES for i in range(len(SHAPES)))
    counts = request.getfixturevalue("staged")
    loaded = st_paddle.load_file(every_dtype, backend=backend)
    # More copies than tensors with bytes: large tensors are copied slab by slab.
    assert counts["copies"] > sum(1 for _, shape, data in expected.values() if data)
    assert {name: _dump(t) for name, t in loaded.items()} == expected
    assert all(t.place.is_cpu_place() for t in loaded.values())
    _returned(counts)
    with safe_open(every_dtype, framework="paddle", backend=backend) as f:
        for name in ("F32_0", "I64_2", "BF16_3"):
            assert _dump(f.get_tensor(name)) == expected[name]
    assert {name: _dump(t) for name, t in st_paddle.load(every_dtype.read_bytes()).items()} == expected
    _returned(counts)


def test_the_plain_load_does_not_stage(every_dtype: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    copies: List[int] = []
    monkeypatch.setattr(st_paddle._PaddleCopier, "copy", lambda self, *args: copies.append(1))
    st_paddle.load_file(every_dtype)
    assert copies == []


@pytest.mark.parametrize("backend", ["mmap", "pread"])
def test_a_truncated_file_raises_naming_file_and_tensor(backend: str, tmp_path: Path, staged: Dict[str, Any]) -> None:
    path = tmp_path / "cut.safetensors"
    numpy_save_file({"a": sample("F32", (64, 64), 1), "b": sample("F32", (64, 64), 2)}, path)
    with safe_open(path, framework="paddle", backend=backend) as f:
        os.truncate(path, os.path.getsize(path) - 3 * SLAB)  # "b" loses its last rows, after it was opened
        with pytest.raises(OSError) as info:
            f.get_tensors()
    message = str(info.value)
    assert "cut.safetensors" in message and "tensor `b`" in message, message
    _returned(staged)


def test_a_refused_dtype_raises_before_anything_is_read(tmp_path: Path, staged: Dict[str, Any]) -> None:
    path = tmp_path / "u16.safetensors"
    numpy_save_file({"t": np.arange(4, dtype=np.uint16)}, path)
    with pytest.raises(st_paddle.SafetensorError, match=r"^dtype U16 has no paddle equivalent \(paddle.uint16"):
        st_paddle.load_file(path)
    assert staged["copies"] == 0
