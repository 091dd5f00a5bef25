"""One indexer with numpy semantics on every framework and backend, checked against numpy itself (hypothesis),
and equal to the reference wherever the reference succeeds."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from safetensors import SafetensorError, SafetensorSliceError, safe_open
from safetensors.numpy import save_file


@st.composite
def shapes(draw):
    return tuple(draw(st.lists(st.integers(0, 5), min_size=0, max_size=4)))


@st.composite
def index_items(draw, shape):
    """An index expression for `shape`: ints (in and out of range), slices with any bounds and steps, at most
    one Ellipsis, None, and at most one integer list."""
    items = []
    ellipsis = False
    listed = False
    axis = 0
    for _ in range(draw(st.integers(0, len(shape) + 2))):
        choice = draw(st.integers(0, 9))
        size = shape[axis] if axis < len(shape) else 3
        if choice == 0 and not ellipsis:
            items.append(Ellipsis)
            ellipsis = True
        elif choice == 1:
            items.append(None)
        elif choice == 2 and not listed:
            items.append(draw(st.lists(st.integers(-size - 1, size), max_size=3)))
            listed = True
            axis += 1
        elif choice in (3, 4):
            items.append(draw(st.integers(-size - 1, size)))
            axis += 1
        else:
            bound = st.one_of(st.none(), st.integers(-size - 3, size + 3))
            step = st.one_of(st.none(), st.integers(-3, 3).filter(lambda s: s != 0))
            items.append(slice(draw(bound), draw(bound), draw(step)))
            axis += 1
    if len(items) == 1 and draw(st.booleans()):
        return items[0]
    return tuple(items)


@st.composite
def cases(draw):
    shape = draw(shapes())
    return shape, draw(index_items(shape))


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    return tmp_path_factory.mktemp("slicing")


def numpy_result(array, index):
    try:
        return array[index], None
    except IndexError as e:
        return None, e


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(case=cases())
def test_matches_numpy_on_every_framework_and_backend(files, case):
    shape, index = case
    array = np.arange(int(np.prod(shape, dtype=np.int64)), dtype=np.int32).reshape(shape)
    path = files / "t.safetensors"
    save_file({"t": array}, path)
    expected, error = numpy_result(array, index)
    for framework in ("np", "pt"):
        for backend in ("mmap", "pread"):
            with safe_open(path, framework, backend=backend) as f:
                sl = f.get_slice("t")
                if error is not None:
                    with pytest.raises(SafetensorSliceError):
                        sl[index]
                    continue
                got = sl[index]
                got = got.numpy() if framework == "pt" else got
                assert got.shape == expected.shape, (index, framework, backend)
                np.testing.assert_array_equal(got, expected)


def test_refusals_use_the_references_words_and_keep_ours_as_the_cause(tmp_path):
    # Where the reference refuses the same index, str(e) is its text (test_slice_errors_differential.py
    # compares a whole matrix); our own numpy-style text, naming the tensor and the file, is the cause.
    save_file({"t": np.zeros((2, 3), np.float32)}, tmp_path / "t.safetensors")
    with safe_open(tmp_path / "t.safetensors", "np") as f:
        sl = f.get_slice("t")
        with pytest.raises(IndexError) as info:
            sl[5]
        assert str(info.value) == (
            "Error during slicing [5] with shape [2, 3]: index 5 out of bounds for tensor dimension #0 of size 2"
        )
        assert "index 5 is out of bounds for axis 0 with size 2" in str(info.value.__cause__)
        assert "`t`" in str(info.value.__cause__) and "t.safetensors" in str(info.value.__cause__)
        with pytest.raises(ValueError, match="^Slice step must be a positive integer, got 0$"):
            sl[::0]
        with pytest.raises(IndexError, match=r"^Error during slicing \[0, 0, 0\] with shape \[2, 3\]: more slicing"):
            sl[0, 0, 0]
        with pytest.raises(SafetensorError, match=r"^Only one ellipsis \(...\) is allowed in slice index$"):
            sl[..., ...]
        with pytest.raises(SafetensorSliceError, match="^Unsupported slice index at position 0"):
            sl[1.5]
        with pytest.raises(SafetensorSliceError, match="^Unsupported slice index at position 0"):
            sl["a"]
        # Two integer lists: the reference refuses any list inside a tuple.
        with pytest.raises(SafetensorSliceError, match="^Unsupported slice index at position 0"):
            sl[[0], [0]]
        with pytest.raises(SafetensorSliceError, match="^Invalid index -3 for dimension 0 of size 2$"):
            sl[-3]


def test_slices_read_only_what_they_return(tmp_path):
    # A 64 MiB tensor: a row slice on the pread backend must not read the whole tensor.
    import resource

    rows = np.zeros((1024, 16384), dtype=np.float32)
    rows[7] = 7.0
    save_file({"big": rows}, tmp_path / "big.safetensors")
    with safe_open(tmp_path / "big.safetensors", "np", backend="pread") as f:
        before = resource.getrusage(resource.RUSAGE_SELF).ru_inblock
        row = f.get_slice("big")[7]
    assert row.shape == (16384,) and (row == 7.0).all()
    assert resource.getrusage(resource.RUSAGE_SELF).ru_inblock - before < 64 * 1024 * 1024 // 512


# -- equal to the reference where the reference succeeds ---------------------------------------------------

REFERENCE_INDICES = [
    (slice(None),), (0,), (-1,), (slice(1, None), slice(None, None, 2)), (Ellipsis, 1), (), [],
    (slice(0, 1), Ellipsis), (1, slice(None), slice(1, 3)), (slice(None, None, 3),), (Ellipsis,),
    (slice(0, 10),), (None,), (None, 0, Ellipsis, None), [0, 1], (slice(-2, None), -1),
]


@pytest.mark.parametrize("framework", ["pt", "np"])
@pytest.mark.parametrize("backend", ["mmap", "pread"])
def test_equal_to_the_reference_where_it_succeeds(tmp_path, reference, framework, backend):
    array = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    path = tmp_path / "r.safetensors"
    save_file({"a": array}, path)
    ref = reference.run(
        "import numpy as np\n"
        "from safetensors import safe_open\n"
        "result = []\n"
        "with safe_open(path, framework, backend=backend) as f:\n"
        "    sl = f.get_slice('a')\n"
        "    for index in indices:\n"
        "        try:\n"
        "            t = sl[index]\n"
        "            result.append(np.asarray(t.numpy() if framework == 'pt' else t))\n"
        "        except Exception as e:\n"
        "            result.append(None)\n",
        path=str(path), framework=framework, backend=backend, indices=REFERENCE_INDICES,
    )
    succeeded = 0
    with safe_open(path, framework, backend=backend) as f:
        sl = f.get_slice("a")
        for index, expected in zip(REFERENCE_INDICES, ref):
            if expected is None:
                continue  # the reference refuses it; ours follows numpy (checked above)
            got = sl[index]
            got = got.numpy() if framework == "pt" else got
            assert got.shape == expected.shape, index
            np.testing.assert_array_equal(got, expected)
            succeeded += 1
    assert succeeded >= 9
