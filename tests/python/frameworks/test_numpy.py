"""safetensors.numpy: every dtype numpy (with ml_dtypes) has, packed sub-byte types, byte order, layouts."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from safetensors import SafetensorError, safe_open
import safetensors.numpy as sn
from safetensors.numpy import load, load_file, save, save_file


def make(dtype, shape, seed=0):
    rng = np.random.default_rng(seed)
    dtype = np.dtype(dtype)
    numel = int(np.prod(shape, dtype=np.int64))
    if dtype == np.bool_:
        return rng.integers(0, 2, numel).astype(np.bool_).reshape(shape)
    sub_byte = {np.dtype(ml_dtypes.float4_e2m1fn): 4, np.dtype(ml_dtypes.float6_e2m3fn): 6,
                np.dtype(ml_dtypes.float6_e3m2fn): 6}
    if dtype in sub_byte:
        # Only the low 4 / 6 bits carry a value in ml_dtypes' one-value-per-byte layout.
        bits = sub_byte[dtype]
        return (rng.integers(0, 1 << bits, numel).astype(np.uint8)).view(dtype).reshape(shape)
    return rng.integers(0, 256, numel * dtype.itemsize, dtype=np.uint8).view(dtype).reshape(shape)


def same(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def test_types_cover_every_code_numpy_can_hold():
    assert set(sn._TYPES) == {
        "BOOL", "F4", "F6_E2M3", "F6_E3M2", "U8", "I8", "F8_E5M2", "F8_E4M3", "F8_E8M0", "F8_E4M3FNUZ",
        "F8_E5M2FNUZ", "I16", "U16", "F16", "BF16", "I32", "U32", "F32", "C64", "F64", "I64", "U64",
    }
    assert sn._getdtype("BF16") == np.dtype(ml_dtypes.bfloat16)


def every_dtype():
    """A matrix, an empty and (where the type is not packed) a scalar tensor of every dtype numpy holds."""
    tensors = {}
    for i, (code, dtype) in enumerate(sn._TYPES.items()):
        tensors[f"{code}.m"] = make(dtype, (4, 8), i)
        tensors[f"{code}.e"] = make(dtype, (0, 3), i)
        if code not in ("F4", "F6_E2M3", "F6_E3M2"):
            tensors[f"{code}.s"] = make(dtype, (), i)
    return tensors


@pytest.mark.parametrize("backend", ["mmap", "pread"])
def test_round_trip_every_dtype(tmp_path, backend):
    tensors = every_dtype()
    path = tmp_path / "all.safetensors"
    save_file(tensors, path)
    for source in (load_file(path, backend=backend), load(path.read_bytes())):
        assert sorted(source) == sorted(tensors)
        for name, value in tensors.items():
            assert same(source[name], value), name


@pytest.mark.parametrize("backend", ["mmap", "pread"])
def test_get_tensor_every_dtype_small_and_large(tmp_path, backend):
    # get_tensor builds arrays over the mapping (mmap) or over memory a native read filled (pread): every
    # dtype, empty, scalar and large tensors (above 4 KiB owned reads start on a cache line).
    tensors = every_dtype()
    tensors["big"] = make(np.dtype(np.float32), ((1 << 20) // 4 + 3, 2), 7)
    path = tmp_path / "all.safetensors"
    save_file(tensors, path)
    before = path.read_bytes()
    with safe_open(path, "np", backend=backend) as f:
        for name, value in tensors.items():
            got = f.get_tensor(name)
            assert same(got, value), name
            assert got.flags.writeable, name
            if got.size and backend == "pread":
                got.reshape(-1).view(np.uint8)[0] ^= 0xFF
                assert not same(f.get_tensor(name), got), name  # memory of its own, not shared
            elif got.size:
                got.reshape(-1).view(np.uint8)[0] ^= 0xFF  # the mapping is copy-on-write: the file stays
    assert path.read_bytes() == before


def test_sub_byte_packing_low_bits_first():
    f4 = np.array([0x1, 0x2, 0xF, 0x0], dtype=np.uint8).view(ml_dtypes.float4_e2m1fn)
    data = save({"f4": f4})
    assert data.endswith(bytes([0x21, 0x0F]))
    f6 = np.array([1, 2, 3, 63], dtype=np.uint8).view(ml_dtypes.float6_e2m3fn)
    word = 1 | (2 << 6) | (3 << 12) | (63 << 18)
    assert save({"f6": f6}).endswith(word.to_bytes(3, "little"))
    assert same(load(data)["f4"], f4)
    with pytest.raises(SafetensorError, match="not a whole number of bytes"):
        save({"odd": f4[:3]})


def test_slices_of_packed_types(tmp_path):
    f4 = make(ml_dtypes.float4_e2m1fn, (4, 6), 1)
    path = tmp_path / "p.safetensors"
    save_file({"f4": f4}, path)
    with safe_open(path, "np") as f:
        assert same(f.get_slice("f4")[1:3, 2:6], f4[1:3, 2:6])
        assert same(f.get_tensor("f4"), f4)


def test_big_endian_and_non_contiguous_arrays_write_correct_bytes():
    be = np.arange(5, dtype=">i4")
    assert save({"a": be}) == save({"a": np.arange(5, dtype="<i4")})
    strided = np.arange(24, dtype=np.float32).reshape(4, 6)[:, ::2]
    assert same(load(save({"s": strided}))["s"], np.ascontiguousarray(strided))
    fortran = np.asfortranarray(np.arange(12, dtype=np.int16).reshape(3, 4))
    assert same(load(save({"f": fortran}))["f"], np.ascontiguousarray(fortran))


def test_save_does_not_mutate_the_callers_dict():
    tensors = {"a": np.arange(3, dtype=">i2")}
    save(tensors)
    assert tensors["a"].dtype == np.dtype(">i2")


def test_saving_what_is_not_a_dict_of_arrays_and_loading_what_is_not_bytes_raise_the_reference_errors():
    with pytest.raises(ValueError, match=r"^Expected a dict of \[str, np.ndarray\] but received <class 'list'>$"):
        save([np.zeros(1)])
    with pytest.raises(ValueError, match=r"^Key `a` is invalid, expected np.ndarray but received <class 'list'>$"):
        save({"a": [1]})
    with pytest.raises(SafetensorError, match="dtype object"):
        save({"a": np.array([object()])})
    with pytest.raises(TypeError, match="'str' object is not an instance of 'bytes'"):
        load("not bytes")


def test_mmap_arrays_are_writable_views(tmp_path):
    path = tmp_path / "w.safetensors"
    save_file({"a": np.arange(8, dtype=np.int64)}, path)
    before = path.read_bytes()
    a = load_file(path)["a"]
    assert a.flags.writeable and not a.flags.owndata
    a += 1
    assert path.read_bytes() == before
    b = load_file(path, backend="pread")["a"]
    assert b.flags.writeable
