"""safetensors.tensorflow: the shared framework contract, plus what TensorFlow accepts when saving."""

from __future__ import annotations

import numpy as np
import pytest

tf = pytest.importorskip(
    "tensorflow", reason="tensorflow is not installed (pip install -r requirements-frameworks.txt)"
)

import safetensors.tensorflow as st_tf  # noqa: E402
from test_frameworks_common import ALL_CODES, FrameworkContract, sample  # noqa: E402


class TestTensorFlow(FrameworkContract):
    framework = "tf"
    aliases = ("tensorflow",)
    display_name = "tensorflow"
    module = st_tf
    module_name = "safetensors.tensorflow"
    codes = frozenset(ALL_CODES) - {"F6_E2M3", "F6_E3M2", "F8_E8M0"}
    # The reference cannot save float4 (its TensorSpec has no such name) nor load any float8 (it asks numpy).
    reference_save_codes = codes - {"F4"}
    reference_load_codes = frozenset(
        ["BOOL", "U8", "I8", "I16", "U16", "I32", "U32", "I64", "U64", "F16", "BF16", "F32", "F64", "C64"]
    )
    reference_saves_scalars = False  # its save calls .ctypes on the numpy scalar a 0-d tensor gives
    SETUP = """
import contextlib
import numpy as np
import tensorflow as tf

def make(a):
    return tf.convert_to_tensor(a)

def dump(t):
    return (t.dtype.name, tuple(t.shape), t.numpy().tobytes())

CONTEXTS = [contextlib.nullcontext]
"""


def test_save_takes_variables_and_numpy_arrays() -> None:
    weights = sample("F32", (2, 3), 50)
    data = st_tf.save({"v": tf.Variable(weights), "n": np.arange(4, dtype=np.int8)})
    loaded = st_tf.load(data)
    assert loaded["v"].dtype == tf.float32 and loaded["v"].numpy().tobytes() == weights.tobytes()
    assert loaded["n"].dtype == tf.int8 and loaded["n"].numpy().tolist() == [0, 1, 2, 3]


def test_save_of_0d_tensors_works() -> None:
    data = st_tf.save({"s": tf.constant(2.5, dtype=tf.float16), "i": tf.constant(7, dtype=tf.int64)})
    loaded = st_tf.load(data)
    assert (loaded["s"].dtype, loaded["s"].shape, float(loaded["s"])) == (tf.float16, (), 2.5)
    assert (loaded["i"].dtype, loaded["i"].shape, int(loaded["i"])) == (tf.int64, (), 7)


@pytest.mark.parametrize("value", [[1, 2], 3, "text", None])
def test_save_rejects_values_that_are_not_tensors(value: object) -> None:
    with pytest.raises(ValueError, match=f"^Key `x` is invalid, expected tf.Tensor but received {type(value)}$"):
        st_tf.save({"ok": tf.zeros([2]), "x": value})


def test_save_of_a_symbolic_tensor_fails() -> None:
    seen = []

    @tf.function
    def inside(x: tf.Tensor) -> tf.Tensor:
        with pytest.raises(ValueError, match="^Key `x` is a symbolic tensor, which has no value to save"):
            st_tf.save({"x": x})
        seen.append(True)
        return x

    inside(tf.zeros([2]))
    assert seen == [True]
