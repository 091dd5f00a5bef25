"""Reads over a filesystem that fails on demand (faultfs.py, a FUSE passthrough).

Every read path of read_paths.py, on each backend (direct reads too), over a file whose reads of a chosen range fail with EIO,
stall, or that shrinks after it was opened (its backing file is cut while the kernel still believes the old
size, as an NFS client would): each path returns the right data or raises a clean OSError naming the file
-- never a crash, never a hang (the reads run in a child process with a timeout). The one unprotected path,
touching a zero-copy view of the mapping, is shown once: SIGBUS, in a child, as the README documents.

Needs /dev/fuse, fusermount3 and mfusepy (scripts/setup.sh installs them); skipped where mounting is
refused (an unprivileged container).
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, Iterator, List

import pytest

torch = pytest.importorskip("torch")

from safetensors import _safetensors_cpp as _cpp  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/python: the shared helpers
import read_paths  # noqa: E402

FAULTFS = Path(__file__).resolve().parents[1] / "faultfs.py"
PAGE = 4096


class FaultFS:
    """A mounted faultfs: files written to `backing` appear under `mount`; `set_rules` changes the faults."""

    def __init__(self, backing: Path, mount: Path, rules: Path) -> None:
        self.backing, self.mount, self.rules = backing, mount, rules
        self._all: Dict[str, Any] = {}

    def add(self, name: str, **rules: Any) -> Path:
        """A fresh file `name` holding read_paths.tensors(), with these faults; its path on the mount."""
        save_file(read_paths.tensors(), self.backing / name)
        self._all[name] = rules
        tmp = self.rules.with_suffix(".tmp")
        tmp.write_text(json.dumps(self._all))
        os.replace(tmp, self.rules)
        return self.mount / name


def _unmount(mount: Path, server: "subprocess.Popen[bytes]") -> None:
    if subprocess.run(["fusermount3", "-u", str(mount)], capture_output=True).returncode != 0:
        subprocess.run(["fusermount3", "-uz", str(mount)], capture_output=True)  # busy: detach lazily
    try:
        server.wait(timeout=10)
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait()


@pytest.fixture(scope="module")
def faultfs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FaultFS]:
    try:
        import mfusepy  # noqa: F401
    except (ImportError, OSError) as e:
        if os.environ.get("CI"):
            pytest.fail(f"mfusepy (requirements-dev.txt) or libfuse3 (scripts/setup.sh) is missing: {e}")
        pytest.skip(f"mfusepy or libfuse3 is missing (run scripts/setup.sh): {e}")
    if not os.path.exists("/dev/fuse"):
        pytest.skip("no /dev/fuse on this machine")
    if shutil.which("fusermount3") is None:
        pytest.skip("fusermount3 (Debian fuse3) is not installed")
    root = tmp_path_factory.mktemp("faultfs")
    backing, mount, rules = root / "backing", root / "mnt", root / "rules.json"
    backing.mkdir()
    mount.mkdir()
    rules.write_text("{}")
    server = subprocess.Popen([sys.executable, str(FAULTFS), str(backing), str(mount), str(rules)],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 20
    while not os.path.ismount(mount):
        if server.poll() is not None:
            out = server.stdout.read().decode(errors="replace") if server.stdout else ""
            pytest.skip(f"mounting a FUSE filesystem was refused: {out.strip()[-500:]}")
        if time.monotonic() > deadline:
            _unmount(mount, server)
            pytest.fail("faultfs did not mount within 20 s")
        time.sleep(0.05)
    try:
        yield FaultFS(backing, mount, rules)
    finally:
        _unmount(mount, server)


def _layout() -> Dict[str, int]:
    """Where tensor `b` lies in a file of read_paths.tensors(): [b_begin, b_end) as file offsets."""
    file = _cpp.File.from_buffer(read_paths.save_bytes())
    _, (_, _, begin, end) = [i for i in file.infos() if i[0] == "b"][0]
    return {"b_begin": file.data_offset + begin, "b_end": file.data_offset + end}


def _by_path(results: List[Dict[str, Any]]) -> Dict[str, Dict[str, Any]]:
    return {r["path"]: r for r in results}


def assert_clean_error(r: Dict[str, Any], path: Path, text: str) -> None:
    assert not r["ok"], r
    if r["path"] == "cli verify":
        assert r["type"] == "exit 1" and f"FAIL {path}" in r["message"] and text in r["message"], r
        return
    assert r["oserror"], r  # an OSError (SafetensorIOError)
    assert text in r["message"] and f'"{path}"' in r["message"], r
    what = "read of the data buffer" if r["path"] == "File.read_range" else "read of tensor `b`"
    assert what in r["message"], r


@pytest.mark.parametrize("backend", ["mmap", "pread", "direct"])
def test_eio_in_a_tensor(faultfs: FaultFS, backend: str) -> None:
    b = _layout()
    # Pages 16..31 of `b` fail. Element [250, 7] lies far past them: that read succeeds.
    lo = (b["b_begin"] // PAGE + 16) * PAGE
    path = faultfs.add(f"eio-{backend}.safetensors", eio=[[lo, lo + 16 * PAGE]])
    # The mmap backend really maps the FUSE file; the direct one really reads it with O_DIRECT (FUSE passes
    # such reads to the filesystem, past the page cache).
    assert _cpp.File(str(path), backend).backend == backend
    results = _by_path(read_paths.run(str(path), backend, timeout=60))
    element = results.pop("pt get_slice element")
    assert element["ok"] and element["correct"], element
    for r in results.values():
        assert_clean_error(r, path, "Input/output error")
        assert r["path"] == "cli verify" or r["errno"] == errno.EIO, r


@pytest.mark.parametrize("backend", ["mmap", "pread", "direct"])
def test_a_file_that_shrinks_after_open(faultfs: FaultFS, backend: str) -> None:
    b = _layout()
    path = faultfs.add(f"shrink-{backend}.safetensors")
    cut = b["b_begin"] + 16
    results = read_paths.run(str(path), backend, "--truncate", str(faultfs.backing / path.name), str(cut), timeout=60)
    for r in results:
        if r["path"] in ("cli verify", "load_file"):
            # They open the file after it shrank: an ordinary format error (the kernel learned the new size
            # from the short reads), or, while it still believes the old one, the short read itself.
            assert not r["ok"], r
            assert "MetadataIncompleteBuffer" in r["message"] or "shorter than expected" in r["message"], r
            continue
        assert_clean_error(r, path, "file is shorter than expected")


@pytest.mark.parametrize("backend", ["mmap", "pread", "direct"])
def test_a_stalled_read_finishes_with_the_right_data(faultfs: FaultFS, backend: str) -> None:
    b = _layout()
    lo = (b["b_begin"] // PAGE + 8) * PAGE
    path = faultfs.add(f"stall-{backend}.safetensors", stall=[[lo, lo + PAGE, 1.0]])
    start = time.monotonic()
    results = read_paths.run(str(path), backend, timeout=60)
    assert time.monotonic() - start >= 1.0  # the stall happened
    for r in results:
        assert r["ok"] and r["correct"], r


def test_a_filesystem_that_refuses_o_direct_is_read_through_the_page_cache(
        faultfs: FaultFS, caplog: pytest.LogCaptureFixture) -> None:
    import logging

    path = faultfs.add("refuse-direct.safetensors", refuse_direct=True)
    file = _cpp.File(str(path), "direct")
    assert file.backend == "pread" and file.source_kind == "pread"
    assert file.source_stats()["direct_refused"] == 1
    for r in read_paths.run(str(path), "direct", timeout=60):
        assert r["ok"] and r["correct"], r
    caplog.set_level(logging.DEBUG, logger="safetensors")
    from safetensors import safe_open

    with safe_open(path, "pt", backend="direct") as f:
        assert torch.equal(f.get_tensor("b"), read_paths.tensors()["b"])
    assert any("the filesystem refused O_DIRECT" in r.getMessage() for r in caplog.records), caplog.text


# The documented limit: a zero-copy CPU tensor is a view of the mapping, and touching a page the file cannot
# back any more raises SIGBUS. Everything the library reads itself is protected (above); this is not.
_TOUCH_VIEW = """
import sys
from safetensors import safe_open
f = safe_open(sys.argv[1], "pt", backend="mmap")
t = f.get_tensor("b")  # a view: nothing is read yet
print("view", flush=True)
t.sum()
print("read", flush=True)
"""


def test_touching_a_zero_copy_view_of_a_failing_page_raises_sigbus(faultfs: FaultFS) -> None:
    b = _layout()
    lo = (b["b_begin"] // PAGE + 16) * PAGE
    path = faultfs.add("view.safetensors", eio=[[lo, lo + PAGE]])
    proc = subprocess.run([sys.executable, "-c", _TOUCH_VIEW, str(path)], capture_output=True, text=True, timeout=60)
    assert proc.stdout.split() == ["view"], (proc.stdout, proc.stderr[-2000:])
    assert proc.returncode == -signal.SIGBUS, (proc.returncode, proc.stderr[-2000:])
