"""safetensors.flax (JAX arrays): the shared framework contract, plus jax's 64-bit rule."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

jax = pytest.importorskip("jax", reason="jax is not installed (pip install -r requirements-frameworks.txt)")

import jax.numpy as jnp  # noqa: E402

import safetensors.flax as st_flax  # noqa: E402
from safetensors import safe_open  # noqa: E402
from safetensors.numpy import _TYPES as NUMPY_TYPES  # noqa: E402
from test_frameworks_common import ALL_CODES, FrameworkContract  # noqa: E402

_SIXTY_FOUR = ("I64", "U64", "F64")


# Without jax_enable_x64, jax narrows the random F64 samples to float32, and numpy warns about the overflow.
@pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning")
class TestFlax(FrameworkContract):
    framework = "flax"
    aliases = ("jax",)
    display_name = "flax"
    dtype_owner = "jax"
    module = st_flax
    module_name = "safetensors.flax"
    codes = frozenset(ALL_CODES) - {"F6_E2M3", "F6_E3M2"}  # XLA has no float6
    # The reference cannot save float4 (its TensorSpec has no such name) nor load any float8 (it asks numpy).
    reference_save_codes = codes - {"F4"}
    reference_load_codes = frozenset(
        ["BOOL", "U8", "I8", "I16", "U16", "I32", "U32", "I64", "U64", "F16", "BF16", "F32", "F64", "C64"]
    )
    SETUP = """
import contextlib
import numpy as np
import jax
import jax.numpy as jnp

def make(a):
    return jnp.asarray(a)

def dump(t):
    return (str(t.dtype), tuple(t.shape), np.asarray(t).tobytes())

# jax's default (64-bit types become 32-bit), then jax_enable_x64 (every code exact).
CONTEXTS = [contextlib.nullcontext, lambda: jax.enable_x64(True)]
"""


@pytest.mark.parametrize("code", _SIXTY_FOUR)
def test_without_x64_64_bit_tensors_convert_as_jnp_asarray_does(code: str, tmp_path: Path) -> None:
    array = (np.arange(6) * 7 - 3 * (code != "U64")).reshape(3, 2).astype(NUMPY_TYPES[code])  # fits in 32 bits
    st_flax.save_file({"t": array}, tmp_path / "x.safetensors")
    with safe_open(tmp_path / "x.safetensors", framework="np") as f:
        assert f.get_slice("t").get_dtype() == code
    loaded = st_flax.load_file(tmp_path / "x.safetensors")["t"]
    assert loaded.dtype == jnp.asarray(array).dtype == {"I64": jnp.int32, "U64": jnp.uint32, "F64": jnp.float32}[code]
    np.testing.assert_array_equal(np.asarray(loaded), np.asarray(jnp.asarray(array)))
    with jax.enable_x64(True):
        exact = st_flax.load_file(tmp_path / "x.safetensors")["t"]
        assert exact.dtype == array.dtype
        assert np.asarray(exact).tobytes() == array.tobytes()


def test_save_accepts_what_np_asarray_accepts_like_the_reference() -> None:
    data = st_flax.save({"list": [1, 2], "np": np.arange(3, dtype=np.int16), "scalar": np.float32(2.5)})
    loaded = st_flax.load(data)
    assert [str(v.dtype) for v in loaded.values()] == ["int32", "float32", "int16"]  # jax's 32-bit default
    with jax.enable_x64(True):
        loaded = st_flax.load(data)
    assert {k: (str(v.dtype), v.shape, np.asarray(v).tolist()) for k, v in loaded.items()} == {
        "list": ("int64", (2,), [1, 2]),
        "np": ("int16", (3,), [0, 1, 2]),
        "scalar": ("float32", (), 2.5),
    }
