"""Direct I/O from Python (backend="direct" and backend="auto"; README, "Backends").

- Every read path gives the file's exact bytes when tensors lie at offsets that are not multiples of 512 or
  4096, are smaller than a block, end the file inside a block, and for slices of rows that start mid-block.
- Owned tensors (load_file, get_tensors, the CPU prefetch) are read straight into their own memory, which is
  placed congruent with the file; each tensor keeps its own storage, and saving a loaded dict works.
- tmpfs reads without an error, whichever way the kernel allows O_DIRECT there.
- ``auto`` reads a cached file through the page cache and an evicted one (posix_fadvise DONTNEED, confirmed
  with mincore) directly, and a direct read leaves the file uncached; device loads and prefetches from a
  mapping handle read as ``auto``; the ``safetensors`` logger says which way a file is read.
"""

from __future__ import annotations

import ctypes
import logging
import os
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from safetensors import _safetensors_cpp as _cpp  # noqa: E402
from safetensors import SafetensorError, safe_open  # noqa: E402
from safetensors._safe_open import reading_backend  # noqa: E402
from safetensors.numpy import load_file as np_load_file  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402

# The page-cache helpers the benchmarks use (torch-free: resident_fraction by mincore, evict, warm).
sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench"))
import worker as page_cache  # noqa: E402

resident_fraction = page_cache.resident_fraction
warm = page_cache.warm

PAGE = os.sysconf("SC_PAGE_SIZE")
AUTO_MIN = 64 << 20  # kAutoDirectMinBytes


def evict(path: Path) -> None:
    """Drops the file from the page cache (bench/worker.py's evict), or skips where the kernel does not."""
    if page_cache.evict(str(path)) > 0.05:
        pytest.skip(f"posix_fadvise(DONTNEED) does not evict {path} here")


def pattern(n: int, seed: int) -> torch.Tensor:
    """``n`` bytes with period 251 (no two blocks of a power-of-two size agree)."""
    return ((torch.arange(n, dtype=torch.int64) * 131 + 7 + seed) % 251).to(torch.uint8)


# Sizes in file order (U8 sorts after the wider types, by name): smaller than a block, across 512 and 4096
# boundaries, several read chunks, and a last tensor that ends the file inside a block.
U8_SIZES = [3, 509, 4093, 1, 4097, (1 << 20) + 13, 700, (9 << 20) + 5, 65537, 333]


def unaligned_model() -> dict:
    tensors = {f"u{i:02d}": pattern(n, i) for i, n in enumerate(U8_SIZES)}
    # Wider types first in the file; rows of 100 bytes so row slices start mid-block.
    tensors["rows"] = pattern(3000 * 100, 99).reshape(3000, 100)
    tensors["bf16"] = pattern(2 * 70001, 5).view(torch.bfloat16)
    tensors["f32"] = pattern(4 * 12345, 6).view(torch.float32).reshape(12345)
    return tensors


@pytest.fixture
def model_path(tmp_path: Path) -> Path:
    path = tmp_path / "model.safetensors"
    save_file(unaligned_model(), path)
    data_offset = _cpp.File(str(path), "pread").data_offset
    assert data_offset % 512 and os.path.getsize(path) % 512  # nothing lines up by accident
    return path


def raw(t: torch.Tensor) -> bytes:
    return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def same(a: dict, b: dict) -> bool:
    """Equal names, dtypes, shapes and bytes (the float patterns hold NaNs, which torch.equal calls unequal)."""
    return a.keys() == b.keys() and all(
        a[k].dtype == b[k].dtype and a[k].shape == b[k].shape and raw(a[k]) == raw(b[k]) for k in a)


@pytest.fixture
def straight():
    """Direct sources read straight into aligned destinations, whatever the device under the file suggests."""
    _cpp.set_direct_bounce(False)
    yield
    _cpp.set_direct_bounce(None)


@pytest.fixture(params=[False, True], ids=["straight", "bounced"])
def copies(request: pytest.FixtureRequest):
    """Both ways of reading directly: straight into aligned destinations, everything through bounce memory."""
    _cpp.set_direct_bounce(request.param)
    yield request.param
    _cpp.set_direct_bounce(None)


@pytest.mark.parametrize("backend", ["direct", "auto"])
def test_every_read_path_gives_the_exact_bytes_of_unaligned_tensors(model_path: Path, backend: str,
                                                                    copies: bool) -> None:
    want = unaligned_model()
    file = _cpp.File(str(model_path), backend)
    if backend == "direct":
        assert file.backend == "direct" and file.source_kind == "direct"
    assert same(load_file(model_path, backend=backend), want)
    with safe_open(model_path, "pt", backend=backend) as f:
        assert same(f.get_tensors(), want)
        assert all(raw(f.get_tensor(k)) == raw(want[k]) for k in ("u00", "u03", "u09", "rows", "f32"))
        rows = f.get_slice("rows")
        for start, stop in [(0, 1), (7, 2999), (41, 42), (2999, 3000), (13, 1300)]:
            assert torch.equal(rows[start:stop], want["rows"][start:stop])
        assert torch.equal(rows[:, 13:17], want["rows"][:, 13:17])
        assert torch.equal(rows[5:2000:3, 90:], want["rows"][5:2000:3, 90:])
        with f.prefetch() as loader:
            assert same(dict(loader), want)
        with f.prefetch({"rows": slice(11, 1234), "u07": None}) as loader:
            got = dict(loader)
        assert torch.equal(got["rows"], want["rows"][11:1234]) and torch.equal(got["u07"], want["u07"])
    # numpy builds from buffers (File.read(dlpack=False)), not DLPack capsules.
    np_got = np_load_file(model_path, backend=backend)
    assert all(np.array_equal(np_got[k].view(np.uint8), want[k].view(torch.uint8).numpy()) for k in want)
    for start, length in [(0, file.size - file.data_offset), (1, 1), (4095, 4098), (12345, 3_000_001)]:
        buf = bytearray(length)
        file.read_range(start, ctypes.addressof(ctypes.c_char.from_buffer(buf)), length, threads=3)
        whole = model_path.read_bytes()[file.data_offset:]
        assert bytes(buf) == whole[start:start + length]


def test_owned_tensors_are_read_straight_into_memory_of_their_own(model_path: Path, tmp_path: Path,
                                                                   straight: None) -> None:
    file = _cpp.File(str(model_path), "direct")
    assert file.backend == "direct"
    unit = PAGE  # at least the direct-I/O alignment of the filesystems here
    before = file.source_stats()["bounced_bytes"]  # the header's read
    loaded = {name: torch.from_dlpack(capsule) for name, capsule in file.read_all()}
    stats = file.source_stats()
    assert stats["direct_bytes"] > 0 and stats["cached_bytes"] == 0 and stats["direct_refused"] == 0
    # Tensors of 64 KiB or more land in memory congruent with the file: only their unaligned edges go through
    # bounce memory. Smaller ones (in bytearrays) bounce whole.
    sizes = [t.numel() * t.element_size() for t in loaded.values()]
    small = sum(n for n in sizes if n < 64 << 10)
    large = sum(1 for n in sizes if n >= 64 << 10)
    assert stats["bounced_bytes"] - before <= small + 2 * unit * large
    # Each tensor owns its storage (freeable alone), and the loaded dict saves back to the same bytes.
    tensors = load_file(model_path, backend="direct")
    assert len({t.untyped_storage().data_ptr() for t in tensors.values()}) == len(tensors)
    assert all(t.untyped_storage().nbytes() == t.numel() * t.element_size() for t in tensors.values())
    out = tmp_path / "again.safetensors"
    save_file(tensors, out)
    assert out.read_bytes() == model_path.read_bytes()
    # The CPU prefetch allocates its tensors the same way (File.destination).
    with safe_open(model_path, "pt", backend="direct") as f:
        handle = f._open().file
        before = handle.source_stats()["bounced_bytes"]
        with f.prefetch({"u07": None}) as loader:
            big = loader.take("u07")
        assert handle.source_stats()["bounced_bytes"] - before <= 2 * unit
    assert torch.equal(big, unaligned_model()["u07"])


def test_tmpfs_is_read_without_an_error(model_path: Path) -> None:
    if not os.path.isdir("/dev/shm"):
        pytest.skip("no /dev/shm")
    shm = Path("/dev/shm") / f"st_direct_{os.getpid()}.safetensors"
    shutil.copyfile(model_path, shm)
    try:
        file = _cpp.File(str(shm), "direct")
        assert same(load_file(shm, backend="direct"), unaligned_model())
        stats = file.source_stats()
        # Linux 6.6 and later read O_DIRECT on tmpfs (from memory); before, the open is refused and the file is
        # read through the cache. Either way: no error, the same bytes.
        assert (stats["direct_bytes"] > 0) != bool(stats["direct_refused"]), stats
        assert file.backend == ("pread" if stats["direct_refused"] else "direct")
    finally:
        shm.unlink()


@pytest.fixture
def big_path(tmp_path: Path) -> Path:
    """A file of at least kAutoDirectMinBytes, fsynced."""
    path = tmp_path / "big.safetensors"
    save_file({"w": pattern(AUTO_MIN + (1 << 20) + 3, 1)}, path, fsync=True)
    return path


def test_auto_reads_a_cached_file_through_the_cache_and_an_evicted_one_directly(big_path: Path) -> None:
    warm(big_path)
    assert resident_fraction(big_path) > 0.99
    cached = _cpp.File(str(big_path), "auto")
    stats = cached.source_stats()
    if not stats["residency_probe"]:
        pytest.skip("no residency probe works here")
    assert cached.backend == "pread" and stats["resident_bytes"] >= cached.size * 0.9

    evict(big_path)
    cold = _cpp.File(str(big_path), "auto")
    assert cold.backend == "direct" and cold.source_kind == "direct"
    assert cold.source_stats()["resident_bytes"] < cold.size * 0.1
    del cached, cold
    # A direct load leaves the file out of the page cache (the next auto load reads it directly too).
    loaded = load_file(big_path, backend="auto")
    assert torch.equal(loaded["w"], pattern(AUTO_MIN + (1 << 20) + 3, 1))
    assert resident_fraction(big_path) < 0.05
    # Through the cache it stays cached.
    load_file(big_path, backend="pread")
    assert resident_fraction(big_path) > 0.99


def test_device_loads_and_prefetches_read_as_auto(big_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # Loads that read rather than view open "mmap", the default, as "auto"; anything asked for stays.
    assert reading_backend("mmap", True) == "auto"
    assert reading_backend("mmap", False) == "mmap"
    assert reading_backend("pread", True) == "pread"
    assert reading_backend("direct", False) == "direct"
    evict(big_path)
    caplog.set_level(logging.DEBUG, logger="safetensors")
    with safe_open(big_path, "pt") as f:
        assert f._open().file.backend == "mmap"
        with f.prefetch() as loader:
            assert loader._file.backend == "direct"
            assert torch.equal(loader.take("w"), pattern(AUTO_MIN + (1 << 20) + 3, 1))
    assert any("(backend auto) is read directly (O_DIRECT)" in r.getMessage() for r in caplog.records), caplog.text
    caplog.clear()
    warm(big_path)
    with safe_open(big_path, "pt", backend="auto"):
        pass
    assert any("(backend auto) is read through the page cache" in r.getMessage() for r in caplog.records), caplog.text


def test_a_backend_it_does_not_know_is_refused_naming_the_four(model_path: Path) -> None:
    with pytest.raises(SafetensorError, match=r'^backend "odirect" is invalid \(expected one of: "mmap", "pread", '
                                              r'"direct", "auto"\)$'):
        load_file(model_path, backend="odirect")
    with pytest.raises(SafetensorError, match="expected one of"):
        _cpp.File(str(model_path)).with_backend("memory")
