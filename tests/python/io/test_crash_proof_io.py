"""Crash-proof I/O, through the Python package.

- A file cut short after it was opened gives an OSError naming the file and the tensor on every read path,
  on the mmap backend too (the reads are positional reads, not copies out of the mapping, which would
  raise SIGBUS). The reads run in a child process (read_paths.py), so a regression fails this test instead
  of killing the test run. This is the one home of that case: read_paths.py lists the paths (a new read
  path is a row there); test_fuse_faults runs the same list over a FUSE file that shrinks; the staging
  deliveries (the NPU's, paddle's) add only that their slabs come back after the failure.
- Only regular files are opened: a FIFO (without blocking), a directory, a device and a socket are refused
  at open with "not a regular file (...)".
"""

from __future__ import annotations

import errno
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from safetensors import _safetensors_cpp as _cpp  # noqa: E402
from safetensors import SafetensorError, safe_open  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/python: the shared helpers
import read_paths  # noqa: E402
from read_paths import tensors  # noqa: E402


@pytest.mark.parametrize("backend", ["mmap", "pread", "direct"])
def test_a_file_cut_short_after_open_gives_an_error_on_every_read_path(tmp_path: Path, backend: str) -> None:
    path = tmp_path / "model.safetensors"
    save_file(tensors(), path)
    # Keep the header, `a` (4000 bytes) and 16 bytes of `b`.
    cut = _cpp.File(str(path), "pread").data_offset + 4000 + 16
    results = read_paths.run(str(path), backend, "--truncate", str(path), str(cut))
    assert len(results) >= 14, results
    for r in results:
        assert not r["ok"], r
        if r["path"] in ("cli verify", "load_file"):
            # They open the file after it was cut: an ordinary format error.
            assert "MetadataIncompleteBuffer" in r["message"], r
            continue
        # A SafetensorIOError: an OSError with EIO and the file's name, as open() would raise it.
        assert r["oserror"] and r["type"] == "SafetensorIOError", r
        assert r["errno"] == errno.EIO and r["filename"] == str(path), r
        assert "file is shorter than expected" in r["message"], r
        assert f'"{path}"' in r["message"], r
        what = "read of the data buffer" if r["path"] == "File.read_range" else "read of tensor `b`"
        assert what in r["message"], r


@pytest.mark.parametrize("backend", ["mmap", "pread", "direct"])
def test_reads_before_the_cut_still_work_and_nothing_once_it_is_empty(tmp_path: Path, backend: str) -> None:
    path = tmp_path / "model.safetensors"
    want = tensors()
    save_file(want, path)
    with safe_open(path, "pt", backend=backend) as f:
        os.truncate(path, path.stat().st_size - 4096)
        assert torch.equal(f.get_tensor("a"), want["a"])
        assert torch.equal(f.get_slice("b")[:10], want["b"][:10])
        os.truncate(path, 0)
        with pytest.raises(OSError, match="file is shorter than expected.*read of tensor `a`"):
            f.get_slice("a")[::-1]  # a copy on every backend
    # Opened again, the empty file is an ordinary format error.
    with pytest.raises(SafetensorError, match="header too small"):
        safe_open(path, "pt", backend=backend)


# Opened in a child: on a regression the open of a FIFO blocks, and the timeout turns that into a failure.
_OPEN = """
import sys
from safetensors import safe_open
try:
    safe_open(sys.argv[1], "pt", backend=sys.argv[2])
except OSError as e:
    print(type(e).__name__, e)
"""


@pytest.mark.parametrize("backend", ["mmap", "pread", "direct"])
def test_a_fifo_is_refused_without_blocking(tmp_path: Path, backend: str) -> None:
    fifo = tmp_path / "pipe.safetensors"
    os.mkfifo(fifo)
    try:
        proc = subprocess.run([sys.executable, "-c", _OPEN, str(fifo), backend], capture_output=True, text=True,
                              timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail("safe_open blocked on a FIFO")
    assert proc.returncode == 0, proc.stderr
    assert "not a regular file (a FIFO)" in proc.stdout and str(fifo) in proc.stdout, proc.stdout


@pytest.mark.parametrize("backend", ["mmap", "pread", "direct"])
def test_a_directory_a_device_and_a_socket_are_refused(tmp_path: Path, backend: str) -> None:
    sock_path = tmp_path / "s.safetensors"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(sock_path))
    try:
        for path, kind in [(tmp_path, "a directory"), (Path("/dev/null"), "a character device"),
                           (sock_path, "a socket")]:
            with pytest.raises(OSError, match=rf"not a regular file \({kind}\)") as e:
                safe_open(path, "pt", backend=backend)
            assert str(path) in str(e.value)
            with pytest.raises(OSError, match="not a regular file"):
                load_file(path, backend=backend)
    finally:
        sock.close()
