"""python/safetensors/_safetensors_cpp/*.pyi are the reviewed stubs of the native module and its submodules
(`engine`, `sharded`): regenerating them from the built module with nanobind's stubgen must give the same
files, with the same text (as nanobind's own tests/test_stubs.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import safetensors

stubgen = pytest.importorskip("nanobind.stubgen")

REGENERATE = ("python -m nanobind.stubgen -r -p python/stubgen-patterns.txt -m safetensors._safetensors_cpp "
              "-O python/safetensors")


def test_native_module_stubs_are_up_to_date(tmp_path):
    committed = Path(safetensors.__file__).with_name("_safetensors_cpp")
    assert (committed / "__init__.pyi").exists(), "the package ships the stubs of its native module"
    # The patterns type what stubgen cannot see into (PySafeSlice, a CPython type of python/src/py_slice.cc).
    patterns = Path(__file__).resolve().parents[3] / "python" / "stubgen-patterns.txt"
    subprocess.run([sys.executable, "-m", "nanobind.stubgen", "-q", "-r", "-p", str(patterns), "-m",
                    "safetensors._safetensors_cpp", "-O", str(tmp_path)], check=True)
    fresh = tmp_path / "_safetensors_cpp"
    names = sorted(p.name for p in fresh.glob("*.pyi"))
    assert names == ["__init__.pyi", "engine.pyi", "sharded.pyi"]
    assert sorted(p.name for p in committed.glob("*.pyi")) == names, f"regenerate them: {REGENERATE}"
    for name in names:
        assert (fresh / name).read_text() == (committed / name).read_text(), (
            f"the native module's interface changed ({name}): review and commit the new stubs ({REGENERATE})")

