"""safetensors.torch: round trips of every dtype, save checks, devices, models with tied weights, helpers."""

from __future__ import annotations

import struct

import pytest
import torch

from safetensors import SafetensorError, safe_open
import safetensors.torch as st
from safetensors.torch import load, load_file, load_model, save, save_file, save_model

ALL_DTYPES = [d for d in st._TYPES.values()]


def raw(t: torch.Tensor) -> bytes:
    """The tensor's bytes, for exact comparison of dtypes without arithmetic (float8, float4)."""
    t = t.detach().cpu().contiguous()
    if t.numel() == 0:
        return b""
    return t.reshape(-1).view(torch.uint8).numpy().tobytes()


def make(dtype: torch.dtype, shape, seed: int = 0) -> torch.Tensor:
    """Deterministic tensor of any dtype, built from random bytes."""
    g = torch.Generator().manual_seed(seed)
    numel = 1
    for d in shape:
        numel *= d
    nbytes = numel * dtype.itemsize
    data = torch.randint(0, 256, (nbytes,), dtype=torch.uint8, generator=g)
    if dtype == torch.bool:
        data = data % 2
    return data.view(dtype).reshape(shape)


def sample_dict():
    tensors = {}
    for i, dtype in enumerate(ALL_DTYPES):
        name = str(dtype).removeprefix("torch.")
        tensors[f"{name}.matrix"] = make(dtype, (3, 4), i)
        tensors[f"{name}.empty"] = make(dtype, (0, 2), i)
        if dtype != torch.float4_e2m1fn_x2:  # a packed pair has no scalar form (see the test below)
            tensors[f"{name}.scalar"] = make(dtype, (), i)
    return tensors


def assert_same(a: dict, b: dict):
    assert list(sorted(a)) == list(sorted(b))
    for name in a:
        assert a[name].dtype == b[name].dtype, name
        assert a[name].shape == b[name].shape, name
        assert raw(a[name]) == raw(b[name]), name


def test_types_cover_every_torch_dtype_of_the_format():
    assert set(st._TYPES) == {
        "BOOL", "F4", "U8", "I8", "F8_E5M2", "F8_E4M3", "F8_E8M0", "F8_E4M3FNUZ", "F8_E5M2FNUZ",
        "I16", "U16", "F16", "BF16", "I32", "U32", "F32", "C64", "F64", "I64", "U64",
    }
    assert st._getdtype("BF16") is torch.bfloat16
    with pytest.raises(KeyError):
        st._getdtype("F6_E2M3")
    assert st._SIZE[torch.float64] == 8 and st._SIZE[torch.float4_e2m1fn_x2] == 1


@pytest.mark.parametrize("backend", ["mmap", "pread"])
def test_round_trip_every_dtype(tmp_path, backend):
    tensors = sample_dict()
    path = tmp_path / "all.safetensors"
    save_file(tensors, path, metadata={"format": "pt"})
    loaded = load_file(path, backend=backend)
    assert_same(tensors, loaded)
    assert all(t.device.type == "cpu" for t in loaded.values())
    assert_same(tensors, load(save(tensors)))
    assert path.read_bytes() == save(tensors, metadata={"format": "pt"})


def test_float4_shape_is_doubled_in_the_header_and_halved_on_load(tmp_path):
    packed = torch.arange(6, dtype=torch.uint8).view(torch.float4_e2m1fn_x2).reshape(2, 3)
    data = save({"a": packed})
    (n,) = struct.unpack("<Q", data[:8])
    assert b'"dtype":"F4","shape":[2,6]' in data[8 : 8 + n]
    back = load(data)["a"]
    assert back.dtype == torch.float4_e2m1fn_x2 and back.shape == (2, 3) and raw(back) == raw(packed)
    with safe_open_bytes(tmp_path, data) as f:
        assert f.get_slice("a").get_shape() == [2, 6]
        assert raw(f.get_slice("a")[1]) == raw(packed[1])
        assert raw(f.get_slice("a")[:, 2:6]) == raw(packed[:, 1:3])
        with pytest.raises(SafetensorError, match="MisalignedSlice"):
            f.get_slice("a")[:, 1:4]  # starts in the middle of a byte
    # A logical last dimension that is odd has no float4_e2m1fn_x2 form.
    from safetensors import _safetensors_cpp

    buf = torch.zeros(3, dtype=torch.uint8)
    odd = _safetensors_cpp.serialize([("o", "F4", [2, 3], buf.data_ptr(), 3)], None)
    with pytest.raises(SafetensorError, match=r"shape \[2, 3\] as torch.float4_e2m1fn_x2.*must be even"):
        load(odd)
    with pytest.raises(ValueError, match="float4_e2m1fn_x2 scalar"):
        save({"s": packed[0, 0]})


def safe_open_bytes(tmp_path, data, **kw):
    path = tmp_path / "f.safetensors"
    path.write_bytes(data)
    return safe_open(path, "pt", **kw)


def test_mmap_tensors_are_zero_copy_writable_and_have_their_own_storage(tmp_path):
    tensors = {"a": torch.arange(10, dtype=torch.float32), "b": torch.ones(3, 3, dtype=torch.int64)}
    path = tmp_path / "x.safetensors"
    save_file(tensors, path)
    before = path.read_bytes()
    loaded = load_file(path)
    for _name, t in loaded.items():
        # One storage per tensor, exactly its size: tied-weight detection (storage identity) must not see
        # every tensor of a file as shared.
        assert st.storage_size(t) == t.numel() * t.element_size()
        assert st._is_complete(t)
    assert st.storage_ptr(loaded["a"]) != st.storage_ptr(loaded["b"])
    loaded["a"].add_(1)
    assert path.read_bytes() == before
    save_file(loaded, tmp_path / "y.safetensors")  # a loaded dict saves again without a shared-memory error
    assert torch.equal(load_file(tmp_path / "y.safetensors")["a"], tensors["a"] + 1)


# -- save checks -------------------------------------------------------------------------------------------

def test_save_checks_in_the_reference_order_with_its_messages():
    x = torch.arange(4, dtype=torch.float32)
    with pytest.raises(ValueError, match=r"^Expected a dict of \[str, torch.Tensor\] but received <class 'list'>$"):
        save([x])
    with pytest.raises(ValueError, match=r"^Key `a` is invalid, expected torch.Tensor but received <class 'int'>$"):
        save({"a": 1})
    with pytest.raises(ValueError, match=r"^You are trying to save a sparse tensors: `\['a'\]`"):
        save({"a": torch.zeros(3, 3).to_sparse()})
    with pytest.raises(RuntimeError, match=r"(?s)Some tensors share memory.*\[\{'[ab]', '[ab]'\}\].*save_model"):
        save({"a": x, "b": x})
    with pytest.raises(RuntimeError, match="Some tensors share memory"):
        save({"a": x, "b": x[:2]})
    with pytest.raises(ValueError, match=r"^You are trying to save a non contiguous tensor: `a` which is not allowed"):
        save({"a": torch.zeros(3, 3).t()})
    with pytest.raises(NotImplementedError):
        save({"a": torch.zeros(3, device="meta")})
    # Views of one storage that do not overlap are not shared.
    base = torch.arange(10.0)
    assert load(save({"lo": base[:5], "hi": base[5:]}))["hi"].tolist() == [5.0, 6.0, 7.0, 8.0, 9.0]


def test_shared_tensor_helpers():
    a = torch.zeros(2, 3)
    state = {"a": a, "b": a, "c": a[0], "d": torch.zeros(1)}
    groups = st._find_shared_tensors(state)
    assert sorted(sorted(g) for g in groups) == [["a", "b", "c"], ["d"]]
    assert dict(st._remove_duplicate_names(state)) == {"a": ["b", "c"]}
    assert dict(st._remove_duplicate_names({"a": a, "b": a}, preferred_names=["b"])) == {"b": ["a"]}
    assert dict(st._remove_duplicate_names({"a": a, "b": a}, discard_names=["a"])) == {"b": ["a"]}
    with pytest.raises(RuntimeError, match="None is covering the entire storage"):
        st._remove_duplicate_names({"a": a[0], "b": a[0]})
    x = torch.arange(6, dtype=torch.float32)
    assert st.storage_ptr(x) == x.data_ptr() and st.storage_size(x) == 24
    assert st._end_ptr(x[1:3]) - x.data_ptr() == 12
    assert st._is_complete(x) and not st._is_complete(x[:3]) and not st._is_complete(x[1:])
    assert st._tobytes(x[1:3], "x") == x[1:3].numpy().tobytes()
    # Dtypes the format cannot store still pass through the shared-memory checks to the dtype error.
    c128 = torch.zeros(2, dtype=torch.complex128)
    assert st._find_shared_tensors({"c": c128, "d": c128}) == [{"c", "d"}]
    with pytest.raises(SafetensorError, match="complex128, which safetensors cannot store"):
        save({"c": c128})


# -- devices -----------------------------------------------------------------------------------------------

def test_device_forms(tmp_path):
    path = tmp_path / "d.safetensors"
    save_file({"a": torch.arange(3)}, path)
    for device in ("cpu", torch.device("cpu")):
        assert load_file(path, device=device)["a"].device.type == "cpu"
    meta = load_file(path, device="meta")["a"]
    assert meta.device.type == "meta" and meta.shape == (3,) and meta.dtype == torch.int64
    with safe_open(path, "pt", device="meta") as f:
        assert f.get_slice("a")[1:].shape == (2,) and f.get_slice("a")[1:].device.type == "meta"


def test_unavailable_devices_are_clear_errors(tmp_path):
    path = tmp_path / "d.safetensors"
    save_file({"a": torch.arange(3)}, path)
    with pytest.raises(SafetensorError, match=r"device cuda:0 is not available: torch reports no 'cuda' devices"):
        load_file(path, device="cuda:0")
    with pytest.raises(SafetensorError, match=r"device npu:0 is not available: .*torch_npu"):
        load_file(path, device="npu:0")
    # An integer names a device of torch's current accelerator: none on a CPU build of torch; a CUDA build
    # (the free-threaded wheel) names cuda even on a machine without a GPU, which then is not available.
    accelerator = torch.accelerator.current_accelerator()
    no_int = ("device 0 is invalid: an integer names a device of the current accelerator" if accelerator is None
              else rf"device {accelerator.type}:0 is not available: torch reports no '{accelerator.type}' devices")
    with pytest.raises(SafetensorError, match=no_int):
        load_file(path, device=0)
    with pytest.raises(SafetensorError, match="^device foo is invalid$"):
        load_file(path, device="foo")


def test_default_device_context_is_ignored(tmp_path):
    path = tmp_path / "d.safetensors"
    save_file({"a": torch.arange(3.0)}, path)
    with torch.device("meta"):
        for backend in ("mmap", "pread"):
            assert load_file(path, backend=backend)["a"].device.type == "cpu"
        assert load(save({"a": torch.zeros(2, device="cpu")}))["a"].device.type == "cpu"
        with safe_open(path, "pt") as f:
            assert f.get_slice("a")[:2].device.type == "cpu"


# -- models ------------------------------------------------------------------------------------------------

class Tied(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.l1 = torch.nn.Linear(3, 3)
        self.l2 = torch.nn.Linear(3, 3)
        self.l2.weight = self.l1.weight


class Other(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.l1 = torch.nn.Linear(3, 3)
        self.extra = torch.nn.Linear(2, 2)


def test_save_model_and_load_model_with_tied_weights(tmp_path):
    path = tmp_path / "m.safetensors"
    model = Tied()
    user_metadata = {"x": "y"}
    save_model(model, path, metadata=user_metadata)
    assert user_metadata == {"x": "y"}  # not mutated
    with safe_open(path, "pt") as f:
        assert f.keys() == ["l1.bias", "l1.weight", "l2.bias"]
        assert f.metadata() == {"x": "y", "l2.weight": "l1.weight"}
    fresh = Tied()
    assert load_model(fresh, path) == (set(), [])
    assert torch.equal(fresh.l1.weight, model.l1.weight) and fresh.l2.weight is fresh.l1.weight
    assert torch.equal(fresh.l2.bias, model.l2.bias)
    with pytest.raises(RuntimeError) as e:
        load_model(Other(), path)
    assert str(e.value) == (
        "Error(s) in loading state_dict for Other:\n"
        '    Missing key(s) in state_dict: "extra.bias", "extra.weight"\n'
        '    Unexpected key(s) in state_dict: "l2.bias"'
    )
    assert load_model(Other(), path, strict=False) == ({"extra.bias", "extra.weight"}, ["l2.bias"])
    assert load_model(Tied(), path, backend="pread", device="cpu") == (set(), [])


def test_save_model_makes_tensors_contiguous(tmp_path):
    class T(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("w", torch.arange(6.0).reshape(2, 3).t())

    save_model(T(), tmp_path / "t.safetensors")
    assert torch.equal(load_file(tmp_path / "t.safetensors")["w"], torch.arange(6.0).reshape(2, 3).t())
    with pytest.raises(ValueError, match="force_contiguous=True"):
        save_model(T(), tmp_path / "u.safetensors", force_contiguous=False)


def test_zero_copy_tensors_keep_the_mapping_alive_until_the_last_one_dies(tmp_path):
    import gc

    from safetensors import _safetensors_cpp

    path = tmp_path / "life.safetensors"
    save_file({"f32": torch.arange(4.0), "f8": torch.zeros(4, dtype=torch.float8_e4m3fn), "i64": torch.ones(3, dtype=torch.int64)}, path)
    gc.collect()
    base = _safetensors_cpp.live_mappings()
    loaded = load_file(path)  # f32/i64 through DLPack, f8 through frombuffer: both hold the mapping
    with safe_open(path, "pt") as f:
        single = f.get_tensor("i64")
    assert _safetensors_cpp.live_mappings() == base + 2
    f32, f8 = loaded["f32"], loaded["f8"]
    del loaded
    gc.collect()
    assert _safetensors_cpp.live_mappings() == base + 2
    assert torch.equal(f32, torch.arange(4.0)) and raw(f8) == bytes(4)
    del f32, single
    gc.collect()
    assert _safetensors_cpp.live_mappings() == base + 1  # f8 still holds the first mapping
    del f8
    gc.collect()
    assert _safetensors_cpp.live_mappings() == base
