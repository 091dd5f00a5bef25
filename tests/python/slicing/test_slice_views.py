"""Slices on framework="pt", backend="mmap", on the CPU, are strided views of the mapping wherever a view can show
the selection, as the reference's are (it indexes a torch view of the mapping): integers, slices with positive
steps, ``...``, ``None``. They share the storage of the tensor's whole view (which keeps the mapping alive after
the file is closed), and hold what numpy's indexing of the same values holds. A negative step, an integer list
and packed elements (F4) are copies, as are slices on the pread backend and for other frameworks."""

from __future__ import annotations

import gc

import numpy as np
import pytest
import torch

import safetensors._safetensors_cpp as cpp
import safetensors.torch as st
from safetensors import safe_open
from safetensors.torch import save_file

W = torch.arange(4 * 6 * 5, dtype=torch.float32).reshape(4, 6, 5)

VIEWS = [
    (slice(None), slice(1, 3)),  # the tensor-parallel column shard
    (slice(1, 3),),
    (1,),
    (-1, 2),
    (Ellipsis, 2),
    (Ellipsis, slice(0, 5, 2)),
    (slice(None, None, 2), slice(1, None, 3), slice(4, 0, 1)),  # an empty last axis
    (slice(1, 3), slice(None), slice(0, 5, 2)),
    (None, 1, None, slice(None, None, 2)),
    (slice(None), None),
    (1, 2, 3),
    (slice(3, 1),),  # empty
    (slice(2, 1, -1), 0),  # a negative step over one position is no step
    (),
    (Ellipsis,),
]
COPIES = [
    (slice(None, None, -1),),
    (slice(None), slice(4, 1, -2)),
    ([0, 2],),
    (slice(None), [1, 1, 0]),
    ([],),
]


@pytest.fixture
def path(tmp_path):
    p = tmp_path / "w.safetensors"
    save_file({"w": W, "f8": torch.arange(24, dtype=torch.uint8).reshape(4, 6).view(torch.float8_e4m3fn)}, p)
    return p


def storage(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


@pytest.mark.parametrize("index", VIEWS, ids=repr)
def test_selections_a_view_can_show_are_views(path, index):
    with safe_open(path, "pt") as f:
        whole = f.get_tensor("w")
        got = f.get_slice("w")[index]
    expected = W.numpy()[index]
    assert storage(got) == storage(whole)
    assert got.shape == expected.shape and np.array_equal(got.numpy(), expected)


GEOMETRY = r"""
import torch
from safetensors import safe_open
result = []
with safe_open(path, "pt") as f:
    whole = f.get_tensor("w")
    for index in indices:
        try:
            t = f.get_slice("w")[index]
        except Exception as e:
            result.append(type(e).__name__)
            continue
        shares = t.untyped_storage().data_ptr() == whole.untyped_storage().data_ptr()
        # An empty view points at no element, and an axis of length 1 takes no step: where they point is not
        # compared.
        offset = t.storage_offset() if t.numel() else None
        strides = tuple(None if n == 1 else s for n, s in zip(t.shape, t.stride()))
        result.append((tuple(t.shape), strides, offset, shares))
"""


def test_views_have_the_references_geometry(path, reference):
    """Shape, strides, storage offset and shared storage, as the reference's torch views have them."""
    theirs = reference.run(GEOMETRY, path=str(path), indices=VIEWS)
    ours = {"path": str(path), "indices": VIEWS}
    exec(GEOMETRY, ours)
    for index, mine, ref in zip(VIEWS, ours["result"], theirs):
        if index == (slice(2, 1, -1), 0):  # torch refuses a negative step, even over one position
            assert ref == "ValueError"
            continue
        assert mine == ref, index


@pytest.mark.parametrize("index", COPIES, ids=repr)
def test_negative_steps_and_integer_lists_are_copies(path, index):
    with safe_open(path, "pt") as f:
        whole = f.get_tensor("w")
        got = f.get_slice("w")[index]
    expected = W.numpy()[index]
    assert storage(got) != storage(whole) and got.is_contiguous()
    assert got.shape == expected.shape and np.array_equal(got.numpy(), expected)


def test_every_whole_byte_dtype_is_viewed_and_f4_is_copied(tmp_path):
    g = torch.Generator().manual_seed(7)
    tensors = {}
    for code, dtype in sorted(st._TYPES.items()):
        data = torch.randint(0, 256, (4, 6 * dtype.itemsize), dtype=torch.uint8, generator=g)
        tensors[code] = (data % 2 if dtype == torch.bool else data).view(dtype)
    save_file(tensors, tmp_path / "all.safetensors")
    with safe_open(tmp_path / "all.safetensors", "pt") as f:
        for code, value in tensors.items():
            whole, got = f.get_tensor(code), f.get_slice(code)[1:3, 2:]
            want = value[1:3, 1:] if code == "F4" else value[1:3, 2:]  # F4: 2 values per torch element
            assert got.dtype == value.dtype and got.shape == want.shape, code
            assert torch.equal(got.view(torch.uint8), want.view(torch.uint8)), code
            assert (storage(got) == storage(whole)) == (code != "F4"), code


def test_views_keep_the_mapping_alive_and_are_private(path):
    before = path.read_bytes()
    gc.collect()
    base = cpp.live_mappings()
    with safe_open(path, "pt") as f:
        shard = f.get_slice("w")[:, 2:4]
        row = f.get_slice("w")[3]
    assert cpp.live_mappings() == base + 1
    assert torch.equal(shard, W[:, 2:4]) and torch.equal(row, W[3])
    shard.add_(1)  # a private copy-on-write mapping: never the file
    assert path.read_bytes() == before
    del shard
    gc.collect()
    assert cpp.live_mappings() == base + 1
    del row
    gc.collect()
    assert cpp.live_mappings() == base


@pytest.mark.parametrize(("framework", "backend"), [("pt", "pread"), ("np", "mmap")])
def test_other_backends_and_frameworks_keep_copies(path, framework, backend):
    with safe_open(path, framework, backend=backend) as f:
        got = f.get_slice("w")[:, 1:3]
        whole = f.get_tensor("w")
    if framework == "pt":
        assert storage(got) != storage(whole) and got.is_contiguous()
        got = got.numpy()
    else:
        assert not np.shares_memory(got, whole) and got.flags.c_contiguous
    assert np.array_equal(got, W.numpy()[:, 1:3])
