"""Paddle loads through the loading engine (the path GPU and custom-device loads take), run on the CPU.

``safetensors.paddle._STAGE_CPU`` sends CPU loads down the staged path: reader threads into slabs of the
process-wide pool, paddle copies out of each slab into the destination's bytes, the slab recycled after its
copy. Slabs here are 4 KiB and the pool holds four, so tensors span slabs, slabs hold several tensors, and
slabs are reused many times within one load. Every result is compared byte for byte with the plain load.
A copier whose copies complete later (as on a device stream) checks that a slab is recycled only once its copy
completed, with a negative control that removes the engine's event wait and sees the data corrupted.
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
PADDLE_CODES = [code for code in ALL_CODES if code in st_paddle.FRAMEWORK.codes]


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
    _engine._cpp.engine.slab_pool_set_slab_bytes(SLAB)
    _engine.set_staging_capacity(4 * SLAB)
    try:
        yield counts
    finally:
        _engine.set_staging_capacity(256 << 20)
        _engine._cpp.engine.slab_pool_set_slab_bytes(8 << 20)
        _engine._cpp.engine.slab_pool_set_allocator()
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


Dumps = Dict[str, Tuple[str, Tuple[int, ...], bytes]]


@pytest.fixture(scope="module")
def plain(every_dtype: Path) -> Dict[str, Dumps]:
    """The plain load of every_dtype (no engine), by backend."""
    assert not st_paddle._STAGE_CPU
    out = {b: {name: _dump(t) for name, t in st_paddle.load_file(every_dtype, backend=b).items()}
           for b in ("mmap", "pread")}
    assert sorted(out["mmap"]) == sorted(f"{c}_{i}" for c in PADDLE_CODES for i in range(len(SHAPES)))
    return out


@pytest.mark.parametrize("backend", ["mmap", "pread"])
def test_every_dtype_through_the_engine_equals_the_plain_load(
    backend: str, every_dtype: Path, plain: Dict[str, Dumps], staged: Dict[str, Any]
) -> None:
    expected, counts = plain[backend], staged
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
    assert not st_paddle._STAGE_CPU
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


# -- a slab goes back to the pool only once its copy completed -------------------------------------------------

class _LateEvent:
    """Completes on its third query, or when synchronized: then every copy issued before it runs."""

    def __init__(self, copier: "_LateCopier") -> None:
        self._copier, self._upto, self._queries = copier, copier.issued, 0

    def query(self) -> bool:
        self._queries += 1
        if self._queries < 3:
            self._copier.late_queries += 1
            return False
        self.synchronize()
        return True

    def synchronize(self) -> None:
        self._copier.complete(self._upto)


class _LateCopier(st_paddle._PaddleCopier):
    """Paddle's copier with copies that complete later, as on a device stream: each copy is queued and runs (out
    of the slab, as it is then) when an event recorded after it completes."""

    made: List["_LateCopier"] = []

    def __init__(self, place: Any) -> None:
        super().__init__(place)
        self.queue: List[Tuple[Any, ...]] = []
        self.issued = self.late_queries = 0
        _LateCopier.made.append(self)

    def copy(self, *args: Any) -> None:
        self.queue.append(args)
        self.issued += 1

    def complete(self, upto: int) -> None:
        done = self.issued - len(self.queue)
        while done < upto:
            super().copy(*self.queue.pop(0))
            done += 1

    def record(self) -> _LateEvent:
        return _LateEvent(self)


@pytest.fixture
def late(staged: Dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> List[Any]:
    """Late copies; the slabs' memory is kept alive after the pool frees it, so a copy that runs too late reads
    stale bytes, never freed memory."""
    kept: List[Any] = []
    allocate = st_paddle._PaddleCopier.allocate

    def keeping(size: int) -> Tuple[int, Any]:
        address, owner = allocate(size)
        kept.append(owner)
        return address, owner

    monkeypatch.setattr(_LateCopier, "allocate", staticmethod(keeping))
    monkeypatch.setattr(st_paddle, "_PaddleCopier", _LateCopier)
    _LateCopier.made.clear()
    return kept


def test_late_copies_complete_before_their_slab_is_reused(
    every_dtype: Path, plain: Dict[str, Dumps], late: List[Any]
) -> None:
    expected = plain["pread"]
    loaded = {name: _dump(t) for name, t in st_paddle.load_file(every_dtype, backend="pread").items()}
    (copier,) = _LateCopier.made
    assert copier.late_queries > 0 and copier.queue == []  # copies were late, and all ran within the load
    assert loaded == expected


def test_without_the_event_wait_slabs_are_reused_too_early(
    every_dtype: Path, plain: Dict[str, Dumps], late: List[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The negative control: with the engine's event checks removed, the late copies read recycled slabs."""
    expected = plain["pread"]
    monkeypatch.setattr(_engine, "_done", lambda event: True)
    monkeypatch.setattr(_engine, "_await", lambda event: None)
    tensors = st_paddle.load_file(every_dtype, backend="pread")
    (copier,) = _LateCopier.made
    assert copier.queue  # nothing waited for them
    copier.complete(copier.issued)
    loaded = {name: _dump(t) for name, t in tensors.items()}
    assert loaded.keys() == expected.keys()
    corrupted = [name for name in expected if loaded[name] != expected[name]]
    assert len(corrupted) > 0, "late copies read the bytes they were issued for, though their slabs were reused"
