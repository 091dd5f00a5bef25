"""safetensors.mlx: the shared framework contract, plus where MLX differs from the reference on purpose."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict

import numpy as np
import pytest

mx = pytest.importorskip("mlx.core", reason="mlx is not installed (pip install -r requirements-frameworks.txt)")

import safetensors.mlx as st_mlx  # noqa: E402
from test_frameworks_common import FrameworkContract, sample  # noqa: E402


class TestMlx(FrameworkContract):
    framework = "mlx"
    display_name = "mlx"
    module = st_mlx
    module_name = "safetensors.mlx"
    codes = frozenset(
        ["BOOL", "U8", "I8", "I16", "U16", "I32", "U32", "I64", "U64", "F16", "BF16", "F32", "F64", "C64"]
    )
    # The reference cannot save bfloat16 arrays (numpy has no buffer format for them), and loads F64 as float32
    # where we keep float64 (test_f64_stays_float64 below).
    reference_save_codes = codes - {"BF16"}
    reference_load_codes = codes - {"F64"}
    SETUP = """
import contextlib
import ml_dtypes  # the reference reads bfloat16 by numpy's name for it, which exists once ml_dtypes is imported
import numpy as np
import mlx.core as mx

def make(a):
    a = a if a.flags.c_contiguous else a.copy()  # mx.array refuses negative strides
    return mx.array(a, dtype=mx.float64) if a.dtype == np.float64 else mx.array(a)

def dump(t):
    raw = t.view(mx.uint16) if t.dtype == mx.bfloat16 else t
    return (str(t.dtype), tuple(t.shape), np.asarray(raw).tobytes())

CONTEXTS = [contextlib.nullcontext]
"""


def test_f64_stays_float64(reference: Any, tmp_path: Path) -> None:
    values = np.array([1 / 3, 1e-300, -2.5e300, np.pi], dtype=np.float64)
    path = tmp_path / "f64.safetensors"
    st_mlx.save_file({"t": mx.array(values, dtype=mx.float64)}, path)
    ours = st_mlx.load_file(path)["t"]
    assert ours.dtype == mx.float64
    assert np.asarray(ours).tobytes() == values.tobytes()
    theirs: Dict[str, Any] = reference.run(
        "import mlx.core as mx, numpy as np\n"
        "from safetensors.mlx import load_file\n"
        "t = load_file(path)['t']\n"
        "result = (str(t.dtype), np.asarray(t).tolist())\n",
        path=str(path),
    )
    assert theirs[0] == "mlx.core.float32"  # the reference narrows; values that fit float32 agree
    assert theirs[1][0] == float(np.float32(1 / 3))  # narrowing rounds to nearest: exactly this float32


def test_bfloat16_saves_where_the_reference_cannot(tmp_path: Path) -> None:
    values = sample("BF16", (3, 3), 60)
    arr = mx.array(values)
    assert arr.dtype == mx.bfloat16
    st_mlx.save_file({"b": arr}, tmp_path / "b.safetensors")
    from safetensors.numpy import load_file as numpy_load_file

    assert numpy_load_file(tmp_path / "b.safetensors")["b"].tobytes() == values.tobytes()


def test_save_accepts_what_np_asarray_accepts_like_the_reference() -> None:
    loaded = st_mlx.load(st_mlx.save({"list": [1, 2], "scalar": np.float32(2.5), "np": np.arange(2, dtype=np.uint16)}))
    assert {k: (str(v.dtype), tuple(v.shape), v.tolist()) for k, v in loaded.items()} == {
        "list": ("mlx.core.int64", (2,), [1, 2]),
        "np": ("mlx.core.uint16", (2,), [0, 1]),
        "scalar": ("mlx.core.float32", (), 2.5),
    }
