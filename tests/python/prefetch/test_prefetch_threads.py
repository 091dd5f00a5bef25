"""prefetch(threads=N) takes any positive N (a 128-core host passing os.cpu_count() included) and runs at most
the engine's 64 reader threads; it refuses only N < 1, in the reference's words where it has them (0.9.0rc1
parses ``threads`` as an unsigned integer: a negative one is PyO3's OverflowError, a non-integer Python's
TypeError; it has no words for 0, which it parses)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import torch
from conftest import REFERENCE_PYTHON

import safetensors._engine as engine
import safetensors._safetensors_cpp as cpp
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

REFERENCE_RC = Path(__file__).resolve().parents[3] / ".ref-rc"


@pytest.fixture
def path(tmp_path):
    g = torch.Generator().manual_seed(5)
    p = tmp_path / "model.safetensors"
    save_file({f"w{i}": torch.randn(32, 8, generator=g) for i in range(12)}, p)
    return p


@pytest.fixture
def engine_threads(monkeypatch):
    """The reader-thread counts CPU prefetches ask the engine for."""
    asked = []
    real = engine.DirectLoad

    def recording(file, jobs, threads):
        asked.append(threads)
        return real(file, jobs, threads)

    monkeypatch.setattr(engine, "DirectLoad", recording)
    return asked


@pytest.mark.parametrize("threads", [1, 3, 64, 65, 128, 10_000, 2**70])
def test_any_positive_count_loads_and_at_most_64_run(path, engine_threads, threads):
    with safe_open(path, "pt") as f:
        expected = {name: f.get_tensor(name) for name in f.keys()}
        with f.prefetch(threads=threads) as loader:
            got = dict(loader)
    assert got.keys() == expected.keys() and all(torch.equal(got[n], expected[n]) for n in expected)
    assert engine_threads == [min(threads, 64)]
    assert cpp.engine.PREFETCH_MAX_THREADS == 64


def test_the_engine_itself_takes_more_than_its_maximum(path):
    """The clamp lives in the engine (C++ and C API callers get it too); Python's min() only fits 2**70 into
    the native unsigned."""
    with safe_open(path, "pt") as f:
        file = f._open().file
        expected = f.get_tensor("w0")
    for threads in (65, 2**32 - 1):
        got = torch.empty_like(expected)
        loader = cpp.engine.Prefetcher(file, [("w0", 0, expected.nbytes, got.data_ptr())], threads=threads)
        try:
            assert loader.next(timeout=30).kind == "direct"
            assert loader.next(timeout=30).kind == "end"
        finally:
            loader.close()
        assert torch.equal(got, expected)


REFERENCE_CODE = r"""
import sys, tempfile, os, torch
from safetensors import safe_open
from safetensors.torch import save_file
path = os.path.join(tempfile.mkdtemp(), "m.safetensors")
save_file({"w": torch.zeros(2)}, path)
with safe_open(path, "pt") as f:
    for threads in (-1, -2**70, 1.5, None, "2"):
        try:
            f.prefetch(threads=threads)
        except Exception as e:
            print(f"{type(e).__name__}: {e}")
"""


def test_refusals_in_the_references_words(path):
    words = [
        "OverflowError: can't convert negative int to unsigned",
        "OverflowError: can't convert negative int to unsigned",
        "TypeError: 'float' object cannot be interpreted as an integer",
        "TypeError: 'NoneType' object cannot be interpreted as an integer",
        "TypeError: 'str' object cannot be interpreted as an integer",
    ]
    if (REFERENCE_RC / "safetensors" / "__init__.py").exists():
        proc = subprocess.run([REFERENCE_PYTHON, "-c", REFERENCE_CODE], capture_output=True, text=True,
                              env=dict(os.environ, PYTHONPATH=str(REFERENCE_RC)))
        assert proc.stdout.splitlines() == words, proc.stderr
    with safe_open(path, "pt") as f:
        for threads, said in zip((-1, -2**70, 1.5, None, "2"), words):
            with pytest.raises((OverflowError, TypeError)) as info:
                f.prefetch(threads=threads)
            assert f"{type(info.value).__name__}: {info.value}" == said
        with pytest.raises(SafetensorError, match=r"^prefetch threads must be a positive integer, got 0$"):
            f.prefetch(threads=0)
