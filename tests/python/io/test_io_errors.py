"""I/O failures raise one type a program can branch on: SafetensorIOError, both a SafetensorError (as the
reference raises) and an OSError with errno, strerror and filename set; for an errno Python gives an OSError
subclass of its own (PermissionError for EACCES, FileNotFoundError for ENOENT, IsADirectoryError, ...), it is
that subclass too (SafetensorPermissionError, ...), as the reference's main branch raises PermissionError. Its
text starts as the reference's (`Error while serializing: I/O error: No space left on device (os error 28)`)
and names the file.

The filesystems are real: a small tmpfs that fills up and a read-only tmpfs (mounted as root; skipped where
mounting is refused), a folder as the target, a missing parent, a directory without write permission for an
unprivileged child process, and a file truncated under the pread backend."""

from __future__ import annotations

import errno
import os
import pickle
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import safetensors
from safetensors import SafetensorError, SafetensorIOError, safe_open
from safetensors.torch import load_file, save_file

# 400 KiB of data: more than the 64 KiB tmpfs below holds.
BIG = {"w": torch.arange(100_000, dtype=torch.float32)}
SMALL = {"w": torch.arange(4, dtype=torch.float32)}


def _mount(target: Path, options: str) -> None:
    target.mkdir()
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(target)], capture_output=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({proc.stderr.decode().strip() or 'not root'})")


@pytest.fixture
def full_fs(tmp_path):
    """A 64 KiB tmpfs: a save of BIG runs out of space."""
    mnt = tmp_path / "full"
    _mount(mnt, "size=64k")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], check=True)


@pytest.fixture
def readonly_fs(tmp_path):
    mnt = tmp_path / "ro"
    _mount(mnt, "ro,size=64k")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], check=True)


def _save_error(target) -> SafetensorIOError:
    with pytest.raises(SafetensorIOError) as info:
        save_file(BIG, target)
    return info.value


def os_error_class(code: int) -> type:
    """The OSError subclass Python itself picks for ``code`` (OSError where it has none)."""
    return type(OSError(code, os.strerror(code)))


def _check(e: SafetensorIOError, code: int) -> None:
    assert isinstance(e, SafetensorError) and isinstance(e, OSError)
    assert isinstance(e, os_error_class(code)) and type(e).__module__ == "safetensors"
    assert e.errno == code
    assert e.strerror == os.strerror(code)
    expected = f"Error while serializing: I/O error: {os.strerror(code)} (os error {code})"
    assert str(e).startswith(expected), str(e)
    assert e.filename and f'"{e.filename}"' in str(e)


def test_disk_full(full_fs):
    e = _save_error(full_fs / "model.safetensors")
    _check(e, errno.ENOSPC)
    assert Path(e.filename).parent == full_fs
    assert os.listdir(full_fs) == [], "a failed save leaves nothing behind"


def test_disk_full_keeps_the_previous_file(full_fs):
    target = full_fs / "model.safetensors"
    save_file(SMALL, target)
    before = target.read_bytes()
    _check(_save_error(target), errno.ENOSPC)
    assert target.read_bytes() == before
    assert torch.equal(load_file(target)["w"], SMALL["w"])


def test_read_only_filesystem(readonly_fs):
    e = _save_error(readonly_fs / "model.safetensors")
    _check(e, errno.EROFS)
    assert type(e) is SafetensorIOError  # Python has no subclass for EROFS


def test_folder_as_target(tmp_path):
    e = _save_error(tmp_path)
    _check(e, errno.EISDIR)
    assert isinstance(e, IsADirectoryError)
    assert e.filename == str(tmp_path)


def test_missing_parent(tmp_path):
    e = _save_error(tmp_path / "missing" / "model.safetensors")
    _check(e, errno.ENOENT)
    assert isinstance(e, FileNotFoundError)
    assert e.filename == str(tmp_path / "missing")


def test_a_file_as_a_parent(tmp_path):
    (tmp_path / "file").write_bytes(b"")
    e = _save_error(tmp_path / "file" / "model.safetensors")
    _check(e, errno.ENOTDIR)
    assert isinstance(e, NotADirectoryError)
    with pytest.raises(NotADirectoryError) as info:
        safe_open(tmp_path / "file" / "model.safetensors", "pt")
    assert isinstance(info.value, SafetensorIOError) and info.value.errno == errno.ENOTDIR


def test_a_folder_opened_is_an_is_a_directory_error(tmp_path):
    with pytest.raises(IsADirectoryError) as info:
        safe_open(tmp_path, "pt")
    e = info.value
    assert isinstance(e, SafetensorIOError) and e.errno == errno.EISDIR and e.filename == str(tmp_path)
    assert str(e).startswith(f"Error while deserializing header: I/O error: {os.strerror(errno.EISDIR)} (os error 21)")


def test_one_class_per_os_error_subclass_python_picks():
    classes = {os_error_class(code) for code in errno.errorcode} - {OSError}
    ours = SafetensorIOError.__subclasses__()
    assert sorted(c.__name__ for c in ours) == sorted("Safetensor" + c.__name__ for c in classes)
    for cls in ours:
        (builtin,) = [c for c in classes if c.__name__ == cls.__name__.removeprefix("Safetensor")]
        assert cls.__bases__ == (SafetensorIOError, builtin)
        assert getattr(safetensors, cls.__name__) is cls and cls.__module__ == "safetensors"
        assert issubclass(cls, SafetensorError) and issubclass(cls, OSError)
    assert safetensors.SafetensorPermissionError.__bases__[1] is PermissionError  # EACCES and EPERM


def test_numpy_and_serialize_file_raise_the_same_type(tmp_path):
    from safetensors.numpy import save_file as np_save_file

    with pytest.raises(safetensors.SafetensorFileNotFoundError) as info:
        np_save_file({"a": np.zeros(3)}, tmp_path / "missing" / "x.safetensors")
    assert info.value.errno == errno.ENOENT
    with pytest.raises(safetensors.SafetensorIsADirectoryError) as info:
        safetensors.serialize_file({}, tmp_path)
    assert info.value.errno == errno.EISDIR


PERMISSION_CHILD = r"""
import os, pickle, sys
import numpy as np
import safetensors
from safetensors import SafetensorError, safe_open
from safetensors.numpy import save_file
os.setgid(65534); os.setuid(65534)  # after the imports: the interpreter's files need not be readable by nobody
def report(what, call):
    try:
        call()
        print(what, "no error")
    except PermissionError as e:  # what the reference's main branch raises
        copy = pickle.loads(pickle.dumps(e))
        assert type(copy) is type(e) and (copy.errno, copy.filename, str(copy)) == (e.errno, e.filename, str(e))
        print(what, type(e).__name__, isinstance(e, SafetensorError), e.errno, e.filename, str(e), sep="|")
report("save", lambda: save_file({"w": np.zeros(3)}, sys.argv[1]))
report("open", lambda: safe_open(sys.argv[2], "np"))
"""


def test_permission_denied(tmp_path):
    """Saving into a folder, and opening a file (mode 0), that the unprivileged user may not write or read."""
    if os.geteuid() != 0:
        pytest.skip("needs root to run the child as an unprivileged user")
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o755)
    os.chmod(tmp_path, 0o755)
    unreadable = tmp_path / "unreadable.safetensors"
    save_file(SMALL, unreadable)
    os.chmod(unreadable, 0)
    proc = subprocess.run([sys.executable, "-c", PERMISSION_CHILD, str(locked / "model.safetensors"), str(unreadable)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    saved, opened = (line.split("|") for line in proc.stdout.splitlines())
    denied = f"{os.strerror(errno.EACCES)} (os error {errno.EACCES})"
    assert saved[:4] == ["save", "SafetensorPermissionError", "True", str(errno.EACCES)]
    assert Path(saved[4]).parent == locked
    assert saved[5].startswith(f"Error while serializing: I/O error: {denied}")
    assert opened[:5] == ["open", "SafetensorPermissionError", "True", str(errno.EACCES), str(unreadable)]
    assert opened[5].startswith(f"Error while deserializing header: I/O error: {denied}")


def test_pickles_with_its_attributes(tmp_path):
    e = _save_error(tmp_path / "missing" / "model.safetensors")
    copy = pickle.loads(pickle.dumps(e))
    assert type(copy) is type(e) is safetensors.SafetensorFileNotFoundError
    assert (copy.errno, copy.strerror, copy.filename, str(copy)) == (e.errno, e.strerror, e.filename, str(e))
    # In a new interpreter too: the classes are found by name in the package.
    proc = subprocess.run([sys.executable, "-c", "import pickle, sys; e = pickle.loads(sys.stdin.buffer.read()); "
                           "print(type(e).__name__, isinstance(e, FileNotFoundError), e.errno)"],
                          input=pickle.dumps(e), capture_output=True)
    assert proc.stdout.decode().split() == ["SafetensorFileNotFoundError", "True", str(errno.ENOENT)], proc.stderr


def test_a_missing_file_on_open_is_still_the_reference_error(tmp_path):
    missing = tmp_path / "nope.safetensors"
    with pytest.raises(FileNotFoundError, match=f"^No such file or directory: {re.escape(str(missing))}$") as info:
        safe_open(missing, "pt")
    # Also an I/O error like the others.
    e = info.value
    assert isinstance(e, SafetensorIOError) and (e.errno, e.filename) == (errno.ENOENT, str(missing))


REFERENCE_SAVE = """
import torch
from safetensors import SafetensorError
from safetensors.torch import save_file
try:
    save_file({"w": torch.arange(100_000, dtype=torch.float32)}, target)
    result = None
except SafetensorError as e:
    result = str(e)
"""


@pytest.mark.parametrize("case", ["full", "folder"])
def test_text_starts_as_the_references(reference, tmp_path, case, request):
    if case == "full":
        target = request.getfixturevalue("full_fs") / "model.safetensors"
    else:
        target = tmp_path
    theirs = reference.run(REFERENCE_SAVE, target=str(target))
    assert theirs is not None
    head = re.match(r"Error while serializing: I/O error: .*? \(os error \d+\)", theirs).group(0)
    assert str(_save_error(target)).startswith(head)
