"""The binding's one zero-copy export and one owned read (python/src/export.cc), the slicer taking Python
objects, and the table of loading strategies (python/safetensors/_strategies.py)."""

from __future__ import annotations

import gc

import numpy as np
import pytest
import torch

from safetensors import SafetensorError, SafetensorSliceError, _safetensors_cpp as _cpp, _strategies, safe_open
from safetensors._core import DTYPES, serialize

# One tensor per dtype of the table, 12 elements (a whole number of bytes for every bit width), distinct bytes.
_SHAPE = (3, 4)


def _file_of_every_dtype(tmp_path, codes=None):
    """A file holding tensor CODE of dtype CODE for every code (or those given), shape (3, 4), and each
    tensor's bytes."""
    payloads = {}
    arrays = []
    for code in codes or DTYPES:
        nbytes = 12 * DTYPES[code].bits // 8
        data = np.frombuffer(bytes((7 * i + len(code)) % 256 for i in range(nbytes)), dtype=np.uint8).copy()
        arrays.append((code, data))
        payloads[code] = data.tobytes()
    path = tmp_path / "every.safetensors"
    path.write_bytes(_cpp.serialize([(c, c, list(_SHAPE), d.ctypes.data, d.nbytes) for c, d in arrays], None))
    return path, payloads


def _torch_bytes(t: torch.Tensor) -> bytes:
    return t.contiguous().view(-1).view(torch.uint8).numpy().tobytes()


@pytest.mark.parametrize("backend", ["mmap", "pread"])
def test_every_dtype_leaves_through_one_export_with_its_bytes(tmp_path, backend):
    path, payloads = _file_of_every_dtype(tmp_path)
    file = _cpp.File(str(path), backend)
    views = dict(file.view_all())
    owned = dict(file.read_all())
    buffers = dict(file.read_all(dlpack=False))
    for code, want in payloads.items():
        row = DTYPES[code]
        exports = [file.read(code), owned[code]]
        if backend == "mmap":
            exports += [file.view(code), views[code]]
        else:
            assert file.view(code) is None and views[code] is None
        for capsule in exports:
            t = torch.from_dlpack(capsule)
            if row.dlpack_code is None:  # float8/6/4: the bytes, for the adapter to reinterpret
                assert (t.dtype, tuple(t.shape)) == (torch.uint8, (len(want),)), code
            else:
                assert tuple(t.shape) == _SHAPE, code
            assert _torch_bytes(t) == want, code
        for owned_bytes in (file.read(code, dlpack=False), buffers[code]):
            assert isinstance(owned_bytes, bytearray) and owned_bytes == want, code


def test_buffer_is_the_data_buffer_and_none_without_a_mapping(tmp_path):
    path, payloads = _file_of_every_dtype(tmp_path)
    mapped = _cpp.File(str(path), "mmap")
    mv = mapped.buffer()
    assert isinstance(mv, memoryview) and not mv.readonly
    assert mv.tobytes() == path.read_bytes()[mapped.data_offset:]
    assert _cpp.File(str(path), "pread").buffer() is None
    in_memory = _cpp.File.from_buffer(path.read_bytes())
    assert in_memory.buffer().readonly  # bytes: never written through
    assert in_memory.view(in_memory.offset_keys()[0]) is None  # capsules cannot say read-only


def test_an_export_keeps_the_mapping_alive_after_the_file_is_gone(tmp_path):
    # The owner of a view is the File object: the mapping is released with the last export of it.
    path, payloads = _file_of_every_dtype(tmp_path)
    gc.collect()
    before = _cpp.live_mappings()
    file = _cpp.File(str(path), "mmap")
    capsule = file.view("F32")
    mv = file.buffer()
    del file
    gc.collect()
    assert _cpp.live_mappings() == before + 1
    del mv
    gc.collect()
    assert _cpp.live_mappings() == before + 1
    t = torch.from_dlpack(capsule)
    del capsule
    assert _torch_bytes(t) == payloads["F32"]
    del t
    gc.collect()
    assert _cpp.live_mappings() == before


def test_read_all_takes_names_in_their_order_and_names_a_missing_one(tmp_path):
    path, payloads = _file_of_every_dtype(tmp_path)
    file = _cpp.File(str(path), "pread")
    got = file.read_all(["I8", "F64", "BOOL"], threads=2, dlpack=False)
    assert [(name, bytes(b)) for name, b in got] == [(n, payloads[n]) for n in ("I8", "F64", "BOOL")]
    with pytest.raises(SafetensorError, match="File does not contain tensor nope"):
        file.read_all(["I8", "nope"])


def test_the_slicer_takes_python_ints_slices_and_ellipsis(tmp_path):
    path = tmp_path / "t.safetensors"
    a = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    path.write_bytes(_cpp.serialize([("a", "F32", [2, 3, 4], a.ctypes.data, a.nbytes)], None))
    file = _cpp.File(str(path), "pread")
    for spec, want in [
        ([1, slice(None), slice(1, 3)], a[1, :, 1:3]),
        ([Ellipsis, np.int64(-1)], a[..., -1]),
        ([slice(None, None, -1), 0], a[::-1, 0]),
        ([slice(-(2**80), 2**80, 2)], a[::2]),  # bounds beyond 64 bits clamp, as Python's slices do
    ]:
        plan = file.plan_slice("a", spec)
        out = np.empty(plan.shape, np.float32)
        file.read_slice("a", plan, out.ctypes.data)
        np.testing.assert_array_equal(out, want)
    with pytest.raises(SafetensorSliceError, match=r"^slice indices must be integers or None or have an __index__ "
                                                   r"method \(got float\)$"):
        file.plan_slice("a", [slice(1.5)])
    for bad in (True, None, "x", [0]):
        with pytest.raises(SafetensorSliceError, match=r"^only integers, slices \(`:`\) and ellipsis"):
            file.plan_slice("a", [bad])
    with pytest.raises(SafetensorSliceError, match=r"single ellipsis"):
        file.plan_slice("a", [Ellipsis, Ellipsis])
    with pytest.raises(SafetensorSliceError, match=r"too many indices for tensor: tensor is 3-dimensional, but 4"):
        file.plan_slice("a", [0, 0, 0, 0])
    with pytest.raises(SafetensorSliceError, match=r"index 9223372036854775807 is out of bounds for axis 0"):
        file.plan_slice("a", [2**70])


def test_a_backend_that_is_not_a_string_is_named_by_its_str(tmp_path):
    path = tmp_path / "t.safetensors"
    path.write_bytes(serialize({}))
    with pytest.raises(SafetensorError,
                       match=r'^backend "1" is invalid \(expected one of: "mmap", "pread", "direct", "auto"\)$'):
        safe_open(path, "pt", backend=1)


class _Adapter:
    """An adapter for choose(): only the device questions."""

    def is_meta(self, device):
        return device == "meta"

    def stages(self, device):
        return device == "npu"

    def is_cpu(self, device):
        return device == "cpu"


@pytest.mark.parametrize("device, backend, opened_as, strategy", [
    ("meta", "mmap", "mmap", _strategies.META),
    ("npu", "mmap", "mmap", _strategies.STAGED),
    ("npu", "pread", "pread", _strategies.STAGED),
    ("cpu", "mmap", "mmap", _strategies.VIEW),
    ("cpu", "mmap", "pread", _strategies.OWNED),  # the mapping was refused: reads
    ("cpu", "pread", "pread", _strategies.OWNED),
    ("cpu", "direct", "direct", _strategies.OWNED),
    ("cpu", "direct", "pread", _strategies.OWNED),  # O_DIRECT was refused: read through the cache
    ("cpu", "auto", "direct", _strategies.OWNED),
    ("npu", "auto", "direct", _strategies.STAGED),
    ("cpu", None, "memory", _strategies.OWNED),  # load(bytes): copies
    ("xla", "mmap", "mmap", _strategies.OWNED),  # no staging: read on the CPU, then moved
])
def test_one_table_chooses_the_strategy(device, backend, opened_as, strategy):
    class File:
        backend = opened_as

    assert _strategies.choose(_Adapter(), File(), device, backend) == strategy


@pytest.mark.parametrize("framework", ["pt", "np"])
@pytest.mark.parametrize("backend", ["mmap", "pread", "direct"])
def test_get_tensor_and_get_tensors_agree_for_every_dtype(tmp_path, framework, backend):
    codes = [c for c, row in DTYPES.items() if row.torch_name] if framework == "pt" else None
    path, payloads = _file_of_every_dtype(tmp_path, codes)
    with safe_open(path, framework, backend=backend) as f:
        every = f.get_tensors()
        assert list(every) == f.offset_keys()
        for code in payloads:
            one = f.get_tensor(code)
            if framework == "pt":
                assert one.dtype == every[code].dtype == getattr(torch, DTYPES[code].torch_name)
                assert _torch_bytes(one) == _torch_bytes(every[code]) == payloads[code]
            else:
                assert one.shape == every[code].shape == _SHAPE
                assert one.tobytes() == every[code].tobytes()


def test_a_dtype_torch_lacks_is_named(tmp_path):
    path, _ = _file_of_every_dtype(tmp_path, ["F6_E2M3"])
    for backend in ("mmap", "pread"):
        with safe_open(path, "pt", backend=backend) as f:
            with pytest.raises(SafetensorError, match="dtype F6_E2M3 has no torch equivalent"):
                f.get_tensor("F6_E2M3")


def test_get_slice_is_the_native_handle_and_answers_from_the_header(tmp_path):
    # PySafeSlice is native (get_shape/get_dtype/len without a Python frame); [index] goes through
    # the reader, which keeps the file open after the safe_open that made it is closed.
    path = str(tmp_path / "s.safetensors")
    from safetensors.torch import save_file

    save_file({"m": torch.arange(12, dtype=torch.int16).reshape(3, 4), "s": torch.tensor(7.5)}, path)
    with safe_open(path, "pt") as f:
        m, s = f.get_slice("m"), f.get_slice("s")
        assert type(m) is _cpp.PySafeSlice
        with pytest.raises(SafetensorError, match="File does not contain tensor nope"):
            f.get_slice("nope")
    shape = m.get_shape()
    assert shape == [3, 4] and m.get_dtype() == "I16" and len(m) == 3
    shape.append(9)  # a new list each time
    assert m.get_shape() == [3, 4]
    with pytest.raises(TypeError, match="len\\(\\) of a 0-d tensor"):
        len(s)
    assert s.get_shape() == [] and s.get_dtype() == "F32" and s[...].item() == 7.5
    assert torch.equal(m[1:, ::2], torch.arange(12, dtype=torch.int16).reshape(3, 4)[1:, ::2])
    assert m[None].shape == (1, 3, 4)
    with pytest.raises(SafetensorSliceError):
        m[0, 0, 0]
    with pytest.raises(SafetensorError, match="File is closed"):
        f.get_slice("m")
