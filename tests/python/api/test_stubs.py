"""python/safetensors/_safetensors_cpp.pyi is the reviewed stub of the native module: regenerating it from
the built module with nanobind's stubgen must give the same text (as nanobind's own tests/test_stubs.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import safetensors

stubgen = pytest.importorskip("nanobind.stubgen")


def test_native_module_stub_is_up_to_date(tmp_path):
    committed = Path(safetensors.__file__).with_name("_safetensors_cpp.pyi")
    assert committed.exists(), "the package ships the stub of its native module"
    out = tmp_path / "_safetensors_cpp.pyi"
    # The patterns type what stubgen cannot see into (PySafeSlice, a CPython type of python/src/py_slice.cc).
    patterns = Path(__file__).resolve().parents[3] / "python" / "stubgen-patterns.txt"
    subprocess.run([sys.executable, "-m", "nanobind.stubgen", "-q", "-p", str(patterns), "-m",
                    "safetensors._safetensors_cpp", "-o", str(out)], check=True)
    assert out.read_text() == committed.read_text(), (
        "the native module's interface changed: review and commit the new stub "
        "(python -m nanobind.stubgen -p python/stubgen-patterns.txt -m safetensors._safetensors_cpp "
        "-o python/safetensors/_safetensors_cpp.pyi)"
    )
