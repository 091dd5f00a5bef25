"""The framework-independent surface: golden bytes, serialize/deserialize/TensorSpec, safe_open and its errors."""

from __future__ import annotations

import gc
import os
import pickle
import struct
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import safetensors
from safetensors import (
    SafetensorError,
    SafetensorSliceError,
    TensorSpec,
    _safe_open_handle,
    deserialize,
    safe_open,
    serialize,
    serialize_file,
)
from safetensors import _safetensors_cpp as cpp
from safetensors.numpy import save, save_file


def header_of(data: bytes) -> bytes:
    (n,) = struct.unpack("<Q", data[:8])
    return data[8 : 8 + n]


def spec_of(array: np.ndarray, dtype: str) -> TensorSpec:
    return TensorSpec(dtype=dtype, shape=list(array.shape), data_ptr=array.ctypes.data, data_len=array.nbytes)


# -- golden bytes (COMPAT.md section 3) ----------------------------------------------------------------------

def test_golden_int32_zeros():
    data = save({"test": np.zeros((2, 2), dtype=np.int32)})
    assert data == (
        b"\x40\x00\x00\x00\x00\x00\x00\x00"
        b'{"test":{"dtype":"I32","shape":[2,2],"data_offsets":[0,16]}}    '
        + b"\x00" * 16
    )


def test_an_empty_dict_saves_as_an_8_byte_length_and_padded_braces():
    assert save({}) == b"\x08\x00\x00\x00\x00\x00\x00\x00{}      "
    assert serialize({}) == save({})


def test_header_order_metadata_and_padding():
    data = save(
        {
            "x": np.zeros(1, np.float32),
            "a": np.zeros(0, np.float32),
            "B": np.zeros(2, np.uint8),
            "b": np.zeros(2, np.uint64),
            "s": np.zeros((), np.int8),
        },
        metadata={"k": "v"},
    )
    assert header_of(data).rstrip(b" ") == (
        b'{"__metadata__":{"k":"v"},"b":{"dtype":"U64","shape":[2],"data_offsets":[0,16]},'
        b'"a":{"dtype":"F32","shape":[0],"data_offsets":[16,16]},"x":{"dtype":"F32","shape":[1],"data_offsets":[16,20]},'
        b'"s":{"dtype":"I8","shape":[],"data_offsets":[20,21]},"B":{"dtype":"U8","shape":[2],"data_offsets":[21,23]}}'
    )
    padding = len(header_of(data)) - len(header_of(data).rstrip(b" "))
    assert (8 + len(header_of(data))) % 8 == 0 and padding < 8
    assert save({}, metadata={}) == b"\x18\x00\x00\x00\x00\x00\x00\x00" + b'{"__metadata__":{}}     '


def test_escaping_in_names_and_metadata():
    data = save({'q"\\\n\x01é': np.zeros(1, np.uint8)}, metadata={"\t": "\x1f\x7f"})
    assert header_of(data).rstrip(b" ") == (
        b'{"__metadata__":{"\\t":"\\u001f\x7f"},"q\\"\\\\\\n\\u0001\xc3\xa9":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}'
    )
    [(name, info)] = deserialize(data)
    assert name == 'q"\\\n\x01é'


# -- TensorSpec / serialize / serialize_file / deserialize ---------------------------------------------------

def test_tensor_spec_properties_and_errors():
    a = np.arange(6, dtype=np.float32)
    spec = spec_of(a, "float32")
    assert (spec.dtype, spec.shape, spec.data_ptr, spec.data_len) == ("F32", [6], a.ctypes.data, 24)
    f4 = TensorSpec(dtype="float4_e2m1fn_x2", shape=[2, 3], data_ptr=0, data_len=6)
    assert (f4.dtype, f4.shape) == ("F4", [2, 6])  # torch storage shape -> logical shape
    with pytest.raises(SafetensorError, match=r'^Unknown dtype "F32"\. Supported dtypes: bool, '):
        TensorSpec(dtype="F32", shape=[1], data_ptr=0, data_len=4)
    with pytest.raises(SafetensorError, match='Unknown dtype "float33"'):
        TensorSpec(dtype="float33", shape=[1], data_ptr=0, data_len=4)
    with pytest.raises(TypeError):
        TensorSpec("float32", [1], 0, 4)  # keyword-only


def test_serialize_matches_numpy_save_and_file():
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    b = np.array([True, False])
    specs = {"a": spec_of(a, "float32"), "b": spec_of(b, "bool")}
    data = serialize(specs, metadata={"m": "1"})
    assert data == save({"a": a, "b": b}, metadata={"m": "1"})


def test_serialize_file_and_deserialize(tmp_path):
    a = np.arange(4, dtype=np.int16)
    path = tmp_path / "x.safetensors"
    serialize_file({"a": spec_of(a, "int16")}, path)
    assert path.read_bytes() == save({"a": a})
    serialize_file({"a": spec_of(a, "int16")}, str(path), metadata={"v": "2"}, fsync=True)
    out = deserialize(path.read_bytes())
    # The file's bytes, little-endian on every host (a TensorSpec's memory is native).
    assert out == [("a", {"dtype": "I16", "shape": [4], "data": bytearray(a.astype("<i2").tobytes())})]
    assert isinstance(out[0][1]["data"], bytearray)


def test_serialize_rejects_plain_dicts_and_bad_sizes():
    with pytest.raises(TypeError, match="not an instance of 'TensorSpec'"):
        serialize({"a": {"dtype": "float32", "shape": [1], "data": b"\0" * 4}})
    a = np.zeros(4, np.float32)
    with pytest.raises(
        SafetensorError, match=r"^Error while serializing: invalid shape, data type, or offset for tensor `a`"
    ):
        serialize({"a": TensorSpec(dtype="float32", shape=[4], data_ptr=a.ctypes.data, data_len=12)})
    with pytest.raises(TypeError, match="metadata"):
        serialize({}, metadata={"k": 1})


def test_deserialize_file_order_and_errors():
    data = save({"big": np.zeros(2, np.float64), "small": np.ones(3, np.uint8)})
    assert [n for n, _ in deserialize(data)] == ["big", "small"]
    with pytest.raises(SafetensorError, match=r"^Error while deserializing: header too small \(HeaderTooSmall\)"):
        deserialize(b"\x01")
    with pytest.raises(SafetensorError, match=r"^Error while deserializing: incomplete metadata, file not fully covered"):
        deserialize(data + b"x")


# -- safe_open -------------------------------------------------------------------------------------------------

@pytest.fixture
def sample(tmp_path):
    path = tmp_path / "sample.safetensors"
    tensors = {
        "a": np.arange(24, dtype=np.float32).reshape(2, 3, 4),
        "b": np.zeros((0, 3), np.float32),
        "s": np.array(5, dtype=np.int64),
    }
    save_file(tensors, path, metadata={"k": "v"})
    return path, tensors


@pytest.mark.parametrize("backend", ["mmap", "pread"])
def test_safe_open_methods(sample, backend):
    path, tensors = sample
    with safe_open(path, framework="np", backend=backend) as f:
        assert f.keys() == ["a", "b", "s"]
        assert f.offset_keys() == ["s", "a", "b"]  # I64 first, then F32 by name
        assert f.metadata() == {"k": "v"}
        for name, value in tensors.items():
            got = f.get_tensor(name)
            assert got.dtype == value.dtype and got.shape == value.shape
            np.testing.assert_array_equal(got, value)
        assert list(f.get_tensors()) == ["s", "a", "b"]
        sl = f.get_slice("a")
        assert sl.get_shape() == [2, 3, 4] and sl.get_dtype() == "F32"
        np.testing.assert_array_equal(sl[1:, ::2], tensors["a"][1:, ::2])


def test_metadata_absent_is_none(tmp_path):
    save_file({"a": np.zeros(1)}, tmp_path / "x.safetensors")
    with safe_open(tmp_path / "x.safetensors", "numpy") as f:
        assert f.metadata() is None


@pytest.mark.parametrize("close", ["__exit__", "_detach"])
def test_every_method_of_a_closed_handle_raises(sample, close):
    """Closed is one state, the native base's: detaching the base alone closes every method, not only get_slice."""
    path, tensors = sample
    f = safe_open(path, "np")
    tensor = f.get_tensor("a")
    sl = f.get_slice("a")
    if close == "__exit__":
        f.__exit__(None, None, None)
    else:
        f._detach()
    for call in (f.keys, f.offset_keys, f.metadata, f.get_tensors, lambda: f.get_tensor("a"), lambda: f.get_slice("a"),
                 lambda: f.get_tensor_meta("a"), f.prefetch, f._open):
        with pytest.raises(SafetensorError, match="^File is closed$"):
            call()
    np.testing.assert_array_equal(tensor, tensors["a"])  # tensors and slices from before stay valid
    np.testing.assert_array_equal(sl[0], tensors["a"][0])


GET_SLICE_CALLS = """
import sys
from safetensors import safe_open
calls = [((), {}), ((1,), {}), (("nope",), {}), (("a", "b"), {}), ((), {"nam": "a"}), (("a",), {"name": "a"}),
         ((), {"name": 3}), ((), {"name": "a", "zz": 1}), (("a", "a", "a"), {"q": 1}), ((), {"name": "a"}), (("a",), {})]
result = []
with safe_open(path, "np") as f:
    before_close = f.get_slice
    for args, kwargs in calls:
        try:
            result.append(("ok", f.get_slice(*args, **kwargs).get_shape()))
        except Exception as e:
            result.append((type(e).__name__, str(e).split(" (TensorNotFound)")[0]))
for call in (lambda: f.get_slice("a"), lambda: before_close("a")):
    try:
        call()
        result.append("no error")
    except Exception as e:
        result.append((type(e).__name__, str(e)))
"""


def test_get_slice_arguments_and_close_match_the_reference(sample, reference):
    """get_slice is a C method (of safe_open's native base, SafeOpenBase): its argument errors are PyO3's, and it
    raises "File is closed" after the with-block, also when it was looked up before."""
    path, _ = sample
    theirs = reference.run(GET_SLICE_CALLS, path=str(path))
    ours: dict = {"path": str(path)}
    exec(GET_SLICE_CALLS, ours)
    assert ours["result"] == theirs
    assert ours["result"][-1] == ("SafetensorError", "File is closed")


def test_get_slice_of_a_subclass_is_its_own(sample):
    """A subclass's own get_slice comes first, and reaches the native one through super()."""
    path, tensors = sample

    class Counting(safe_open):
        calls = 0

        def get_slice(self, name):
            Counting.calls += 1
            return super().get_slice(name)

    with Counting(path, "np") as f:
        np.testing.assert_array_equal(f.get_slice("a")[0], tensors["a"][0])
    assert Counting.calls == 1
    with pytest.raises(SafetensorError, match="^File is closed$"):
        f.get_slice("a")


def test_the_native_base_never_reads_what_is_not_a_file(sample):
    """SafeOpenBase._attach takes only an initialised File (get_slice reads it as one); an unattached base, as a
    closed one, answers "File is closed"."""
    path, _ = sample
    with safe_open(path, "np") as f:
        for args in ((1, 2), (), (cpp.File.__new__(cpp.File), 1), (f,)):
            with pytest.raises(TypeError, match=r"^_attach\(\) takes a File and a reader$"):
                f._attach(*args)
        assert f.get_slice("a").get_shape() == [2, 3, 4]
    with pytest.raises(SafetensorError, match="^File is closed$"):
        cpp.SafeOpenBase().get_slice("a")


def test_errors_match_the_reference(sample, tmp_path):
    path, _ = sample
    with pytest.raises(SafetensorError, match="^framework jax2 is invalid$"):
        safe_open(path, "jax2")
    with pytest.raises(SafetensorError, match="^device cuda2 is invalid$"):
        safe_open(path, "pt", device="cuda2")
    with pytest.raises(SafetensorError, match="^device -1 is invalid$"):
        safe_open(path, "pt", device=-1)
    with pytest.raises(ValueError):
        safe_open(path, "pt", device="cuda:a")
    with pytest.raises(SafetensorError, match="^Device cuda:0 is not supported for framework numpy$"):
        safe_open(path, "np", device="cuda:0")
    with pytest.raises(SafetensorError, match="^Device 0 is not supported for framework numpy$"):
        safe_open(path, "np", device=0)
    with pytest.raises(SafetensorError,
                       match=r'^backend "foo" is invalid \(expected one of: "mmap", "pread", "direct", "auto"\)$'):
        safe_open(path, "np", backend="foo")
    missing = str(tmp_path / "nope.safetensors")
    with pytest.raises(FileNotFoundError, match=f"^No such file or directory: {missing}$"):
        safe_open(missing, "np")
    with pytest.raises(OSError):
        safe_open(tmp_path, "np")
    with safe_open(path, "np") as f:
        with pytest.raises(SafetensorError, match=r"^File does not contain tensor zz \(TensorNotFound\)"):
            f.get_tensor("zz")
        with pytest.raises(SafetensorError, match="^File does not contain tensor zz"):
            f.get_slice("zz")


def test_header_errors_carry_reference_text_token_and_file(tmp_path):
    path = tmp_path / "bad.safetensors"
    path.write_bytes(struct.pack("<Q", 100_000_001) + b"{}")
    with pytest.raises(SafetensorError) as e:
        safe_open(path, "np")
    assert str(e.value) == (
        "Error while deserializing header: header too large: declared length 100000001 exceeds the limit of "
        f'100000000 bytes (HeaderTooLarge) in "{path}"'
    )


def test_safe_open_handle(sample):
    path, _ = sample
    with open(path, "rb") as fh:
        with _safe_open_handle(fh, "np") as f:
            assert f.keys() == ["a", "b", "s"]


def test_safetensor_error_is_picklable_and_importable():
    err = pickle.loads(pickle.dumps(SafetensorError("x")))
    assert type(err) is SafetensorError and err.args == ("x",)
    assert SafetensorError.__module__ == "safetensors"
    assert issubclass(SafetensorSliceError, SafetensorError)
    assert issubclass(SafetensorSliceError, IndexError) and issubclass(SafetensorSliceError, ValueError)
    assert pickle.loads(pickle.dumps(SafetensorSliceError("y"))).args == ("y",)


# -- mmap views: copy-on-write, lifetime ---------------------------------------------------------------------

def test_mmap_views_are_copy_on_write_and_outlive_the_handle(sample):
    path, tensors = sample
    before = path.read_bytes()
    with safe_open(path, "np") as f:
        a = f.get_tensor("a")
    assert a.flags.writeable
    a[0, 0, 0] = 1234.0
    assert path.read_bytes() == before  # writes never reach the file
    with safe_open(path, "np") as f:
        assert f.get_tensor("a")[0, 0, 0] == 0.0


@pytest.mark.skipif(sys.byteorder == "big", reason="on a big-endian host multi-byte tensors are copies, not views "
                    "of the mapping (README, 'Big-endian hosts')")
def test_mapping_released_exactly_when_the_last_tensor_dies(sample):
    path, _ = sample
    gc.collect()
    base = cpp.live_mappings()
    f = safe_open(path, "np")
    a = f.get_tensor("a")
    s = f.get_tensor("s")
    assert cpp.live_mappings() == base + 1
    f.__exit__(None, None, None)
    del f
    gc.collect()
    assert cpp.live_mappings() == base + 1
    del a
    gc.collect()
    assert cpp.live_mappings() == base + 1
    del s
    gc.collect()
    assert cpp.live_mappings() == base


def test_a_handle_dropped_unclosed_lets_go_of_its_file_at_once(sample):
    """No reference cycle holds a safe_open (or its slices) for the collector: dropping the last reference
    unmaps the file, with the collector off."""
    path, tensors = sample
    gc.collect()
    base = cpp.live_mappings()
    gc.disable()
    try:
        f = safe_open(path, "np")
        sl = f.get_slice("a")
        assert cpp.live_mappings() == base + 1
        del f
        assert cpp.live_mappings() == base + 1  # the slice keeps the file
        np.testing.assert_array_equal(sl[1], tensors["a"][1])
        del sl
        assert cpp.live_mappings() == base
    finally:
        gc.enable()


def test_no_leaks_reported_when_everything_is_released(sample):
    path, _ = sample
    code = (
        "import gc, numpy, torch\n"
        "from safetensors import safe_open\n"
        "from safetensors.torch import load_file, save\n"
        f"p = {str(path)!r}\n"
        "for fw in ('np', 'pt'):\n"
        "    for backend in ('mmap', 'pread'):\n"
        "        with safe_open(p, fw, backend=backend) as f:\n"
        "            t = f.get_tensors(); s = f.get_slice('a')[0]\n"
        "        del t, s\n"
        "d = load_file(p); b = save(d); del d, b\n"
        "gc.collect()\n"
        "from safetensors import _safetensors_cpp as c\n"
        "assert c.live_mappings() == 0, c.live_mappings()\n"
    )
    env = dict(os.environ, SAFETENSORS_LEAK_WARNINGS="1")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr
    assert "leaked" not in proc.stderr, proc.stderr


# -- the GIL is released while reading and writing -----------------------------------------------------------

def _progress_during(call) -> int:
    """Counts main-thread loop iterations that happen while `call` runs in another thread."""
    window = {}

    def worker():
        window["start"] = time.perf_counter()
        call()
        window["end"] = time.perf_counter()

    stamps = []
    thread = threading.Thread(target=worker)
    thread.start()
    while thread.is_alive():
        stamps.append(time.perf_counter())
    thread.join()
    return sum(window["start"] < t < window["end"] for t in stamps)


def _progress_in_one_of(call, attempts: int = 20) -> int:
    """The most main-thread progress during `call`, over up to `attempts` runs (stopping at the first with more
    than 10 iterations). Released, the GIL gives tens of thousands in one 50-150 ms call; a busy machine can
    still keep the main thread off the CPU for one whole call, but not for 20. Held, every run gives 0."""
    best = 0
    for _ in range(attempts):
        best = max(best, _progress_during(call))
        if best > 10:
            break
    return best


def test_gil_released_during_reads_and_writes(tmp_path):
    big = np.ones(64 << 20, dtype=np.uint8)  # 64 MiB
    path = tmp_path / "big.safetensors"
    save_file({"w": big}, path)
    with safe_open(path, "np", backend="pread") as f:
        assert _progress_in_one_of(lambda: [f.get_tensor("w") for _ in range(4)]) > 10
    assert _progress_in_one_of(lambda: save_file({"w": big}, path)) > 10
    assert _progress_in_one_of(lambda: save({"w": big})) > 10


def test_version_is_the_reference_release_with_a_cpp_local_part():
    assert safetensors.__version__.startswith("0.8.0+cpp.")


def test_framework_modules_offer_the_names_the_references_import():
    # Other projects import these from the framework modules (paddle: `from safetensors.numpy import safe_open`).
    import safetensors.numpy
    import safetensors.torch

    for module in (safetensors.numpy, safetensors.torch):
        for name in ("TensorSpec", "deserialize", "safe_open", "serialize", "serialize_file"):
            assert getattr(module, name) is getattr(safetensors, name), (module.__name__, name)
