"""safe_open.prefetch / PrefetchLoader (the reference's 0.9 API, COMPAT.md section 7), on the CPU.

The same semantics on the simulated NPU are in test_prefetch_npu.py. Results are compared byte for byte with
``get_tensor`` / ``get_slice`` of the same file."""

from __future__ import annotations

import gc
import threading
import weakref

import pytest
import torch

from safetensors import PrefetchLoader, SafetensorError, TensorMeta, safe_open
from safetensors.torch import save_file

BACKENDS = ["mmap", "pread"]


def state():
    g = torch.Generator().manual_seed(7)
    return {
        "embed": torch.randn(64, 16, generator=g),
        "bias": torch.arange(16, dtype=torch.int64),
        "half": torch.randn(8, 4, generator=g).to(torch.bfloat16),
        "double": torch.randn(5, 3, generator=g, dtype=torch.float64),  # F64: test_prefetch_takes_f64_not_as_f6.py
        "scalar": torch.tensor(2.5),
        "empty": torch.zeros(0, 3),
        "flags": torch.arange(10) % 3 == 0,
        "packed": torch.arange(12, dtype=torch.uint8).view(torch.float4_e2m1fn_x2).reshape(6, 2),
    }


@pytest.fixture
def path(tmp_path):
    p = tmp_path / "model.safetensors"
    save_file(state(), p)
    return p


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.dtype != b.dtype or a.shape != b.shape or a.device != b.device:
        return False
    return a.contiguous().view(-1).view(torch.uint8).tolist() == b.contiguous().view(-1).view(torch.uint8).tolist()


@pytest.mark.parametrize("backend", BACKENDS)
def test_whole_file_matches_get_tensor(path, backend):
    with safe_open(path, "pt", backend=backend) as f:
        expected = {name: f.get_tensor(name) for name in f.keys()}
        loader = f.prefetch()
        assert isinstance(loader, PrefetchLoader)
        assert loader.names() == f.offset_keys()
        assert len(loader) == len(expected)
        got = dict(loader)
    assert got.keys() == expected.keys()
    for name in expected:
        assert same(got[name], expected[name]), name
        assert got[name].device.type == "cpu"
    assert list(loader) == []  # a second pass yields nothing


@pytest.mark.parametrize("backend", BACKENDS)
def test_rows_and_take(path, backend):
    plan = {"embed": slice(3, 10), "bias": None, "half": slice(-3, None), "packed": slice(2, 4), "empty": slice(0, 0)}
    with safe_open(path, "pt", backend=backend) as f:
        with f.prefetch(plan, threads=2) as loader:
            assert loader.names() == [n for n in f.offset_keys() if n in plan]
            assert same(loader.take("embed"), f.get_slice("embed")[3:10])
            assert same(loader.take("half"), f.get_tensor("half")[5:])
            assert same(loader.take("packed"), f.get_tensor("packed")[2:4])
            assert loader.take("empty").shape == (0, 3)
            rest = dict(loader)  # iteration skips what was taken
            assert list(rest) == ["bias"] and same(rest["bias"], f.get_tensor("bias"))
            with pytest.raises(SafetensorError, match="already delivered"):
                loader.take("embed")
            with pytest.raises(SafetensorError, match="not in the prefetch plan"):
                loader.take("flags")
        with pytest.raises(SafetensorError, match="closed"):
            loader.take("bias")
        with pytest.raises(SafetensorError, match="closed"):
            list(loader)


def test_negative_bounds_count_from_the_end(path):
    with safe_open(path, "pt") as f, f.prefetch({"half": slice(-8, 8)}) as loader:
        assert same(loader.take("half"), f.get_tensor("half"))


@pytest.mark.parametrize(
    "plan, message",
    [
        ({"nope": None}, "does not contain"),
        ({"embed": 3}, "None, a slice or a tuple of slices"),
        ({"embed": slice(0, 4, 2)}, "step 1"),
        ({"embed": slice(0, 4, 0)}, "invalid prefetch plan slice"),
        ({"scalar": slice(0, 1)}, "0-d"),
        ({"embed": slice(0, 65)}, "out of range"),
        ({"embed": slice(-65, None)}, "out of range"),
        ({"embed": slice(5, 2)}, "out of range"),
        ({}, "selects no tensors"),
        ({"packed": slice(0, 1, None), "embed": slice(0, 1)}, None),
    ],
)
def test_plan_errors_come_first(path, plan, message):
    with safe_open(path, "pt") as f:
        if message is None:
            with f.prefetch(plan) as loader:
                assert len(loader) == 2
            return
        with pytest.raises(SafetensorError, match=message):
            f.prefetch(plan)


def test_refusals_of_the_handle(path):
    with safe_open(path, "np") as f:
        with pytest.raises(SafetensorError, match='framework="pt"'):
            f.prefetch()
    f = safe_open(path, "pt")
    f.__exit__(None, None, None)
    with pytest.raises(SafetensorError, match="closed"):
        f.prefetch()
    with pytest.raises(SafetensorError, match="closed"):
        f.get_tensor_meta("embed")


def test_f6_is_refused_up_front(tmp_path):
    # Four F6_E2M3 values (6 bits each) fill 3 bytes; torch has no such dtype.
    header = b'{"x":{"dtype":"F6_E2M3","shape":[4],"data_offsets":[0,3]}}'
    header += b" " * (-len(header) % 8)
    p = tmp_path / "f6.safetensors"
    p.write_bytes(len(header).to_bytes(8, "little") + header + bytes(3))
    with safe_open(p, "pt") as f:
        assert f.get_tensor_meta("x").dtype == "F6_E2M3"
        with pytest.raises(SafetensorError, match="F6_E2M3"):
            f.prefetch()
        with pytest.raises(SafetensorError, match="F6_E2M3"):
            f.prefetch({"x": slice(0, 4)})


def test_get_tensor_meta_gives_the_header_entry(path):
    with safe_open(path, "pt", backend="pread") as f:
        meta = f.get_tensor_meta("embed")
        assert isinstance(meta, TensorMeta)
        assert (meta.dtype, meta.shape) == ("F32", [64, 16])
        begin, end = meta.data_offsets
        assert end - begin == 64 * 16 * 4
        assert repr(meta) == f'TensorMeta {{ dtype: "F32", shape: [64, 16], data_offsets: ({begin}, {end}) }}'
        with pytest.raises(SafetensorError, match="does not contain"):
            f.get_tensor_meta("nope")


def test_loader_outlives_the_handle_and_several_run_at_once(path):
    with safe_open(path, "pt", backend="pread") as f:
        expected = f.get_tensor("embed")
        a = f.prefetch({"embed": None})
        b = f.prefetch({"embed": slice(0, 2), "bias": None})
        assert f.keys()  # the handle keeps working
    assert same(a.take("embed"), expected)
    assert same(b.take("embed"), expected[:2])
    a.close()
    b.close()


def test_close_releases_untaken_tensors_and_keeps_taken_ones(path):
    with safe_open(path, "pt") as f:
        loader = f.prefetch()
        taken = loader.take("embed")
        # Wait until the rest landed (the readers land tensors in any order, from their own threads: the loader's
        # condition guards what has landed), then watch them die with close().
        with loader._lock:
            assert loader._lock.wait_for(lambda: len(loader._ready) + len(loader._taken) == len(loader._order), 60)
            held = [weakref.ref(t) for t in loader._ready.values()]
        assert held
        loader.close()
        gc.collect()
        assert all(r() is None for r in held)
        assert same(taken, f.get_tensor("embed"))


def test_take_waits_from_many_threads(path):
    with safe_open(path, "pt", backend="pread") as f:
        expected = {n: f.get_tensor(n) for n in f.keys()}
        with f.prefetch() as loader:
            results = {}

            def take(name):
                results[name] = loader.take(name)

            threads = [threading.Thread(target=take, args=(n,)) for n in loader.names()]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
    assert results.keys() == expected.keys()
    assert all(same(results[n], expected[n]) for n in expected)


def test_prefetch_to_meta_gives_the_planned_shapes(path):
    with safe_open(path, "pt") as f, f.prefetch({"embed": slice(1, 3)}, device="meta") as loader:
        t = loader.take("embed")
        assert t.device.type == "meta" and t.shape == (2, 16)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_tuple_of_slices_takes_a_box_of_the_leading_dimensions(path, backend):
    boxes = {
        "embed": (slice(None), slice(4, 12)),  # a shard of the inner dimension: strided runs
        "half": (slice(2, 3), slice(1, 3)),  # one row's columns: one run
        "double": (slice(1, -1),),  # rows, as a 1-tuple
        "bias": (slice(-4, None),),
        "flags": (),  # nothing narrowed: the whole tensor
        "empty": (slice(0, 0), slice(1, 2)),
    }
    with safe_open(path, "pt", backend=backend) as f:
        with f.prefetch(boxes, threads=2) as loader:
            got = dict(loader)
        assert got.keys() == boxes.keys()
        for name, box in boxes.items():
            assert same(got[name], f.get_slice(name)[box]), name


@pytest.mark.parametrize("plan, message", [
    ({"embed": (slice(0, 4), slice(0, 4), slice(0, 1))}, "has 3 slices but the tensor has 2 dimensions"),
    ({"embed": (slice(None), slice(0, 17))}, "out of range (0..16)"),
    ({"embed": (slice(None), slice(0, 4, 2))}, "step 1"),
    ({"embed": (slice(None), 3)}, "None, a slice or a tuple of slices"),
    ({"scalar": (slice(0, 1),)}, "0-d"),
])
def test_box_plans_are_checked_before_anything_is_read(path, plan, message):
    with safe_open(path, "pt") as f:
        with pytest.raises(SafetensorError) as e:
            f.prefetch(plan)
        assert message in str(e.value)
