"""The function set every framework module gets from safetensors._framework: real signatures (keyword calls with
the reference's parameter names), picklable by name, one text for the non-contiguous error."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest
import torch

import safetensors.numpy as st_numpy
import safetensors.torch as st_torch
from safetensors._framework import non_contiguous_message


def test_numpy_functions_take_the_references_keywords(tmp_path: Path) -> None:
    arrays = {"b": np.arange(6, dtype=np.int16).reshape(2, 3), "a": np.ones(3, np.float32)}
    data = st_numpy.save(tensor_dict=arrays, metadata={"k": "v"})
    assert data == st_numpy.save(arrays, {"k": "v"})
    st_numpy.save_file(tensor_dict=arrays, filename=tmp_path / "m.safetensors", metadata={"k": "v"}, fsync=True)
    assert (tmp_path / "m.safetensors").read_bytes() == data
    for loaded in (st_numpy.load(data=data), st_numpy.load_file(filename=tmp_path / "m.safetensors", backend="pread")):
        assert {k: v.tobytes() for k, v in loaded.items()} == {k: v.tobytes() for k, v in arrays.items()}
    with pytest.raises(TypeError, match="unexpected keyword argument 'tensors'"):
        st_numpy.save(tensors=arrays)
    with pytest.raises(TypeError, match="takes from 1 to 2 positional arguments but 3 were given"):
        st_numpy.save(arrays, None, True)
    with pytest.raises(TypeError, match="unexpected keyword argument 'device'"):
        st_numpy.load_file(tmp_path / "m.safetensors", device="cpu")


def test_torch_load_file_takes_a_device_and_load_does_not(tmp_path: Path) -> None:
    path = tmp_path / "t.safetensors"
    st_torch.save_file(tensors={"t": torch.arange(4)}, filename=path)
    assert st_torch.load_file(filename=path, device="cpu", backend="mmap")["t"].tolist() == [0, 1, 2, 3]
    with pytest.raises(TypeError, match="unexpected keyword argument 'device'"):
        st_torch.load(path.read_bytes(), device="cpu")


def test_functions_belong_to_their_module() -> None:
    for module in (st_numpy, st_torch):
        for name in ("save", "save_file", "load", "load_file"):
            function = getattr(module, name)
            assert (function.__module__, function.__qualname__) == (module.__name__, name)
            assert function.__doc__
            assert pickle.loads(pickle.dumps(function)) is function


def test_one_non_contiguous_message() -> None:
    with pytest.raises(ValueError) as info:
        st_torch.save({"t": torch.zeros(2, 3).t()})
    assert str(info.value) == non_contiguous_message("t")
    assert str(info.value).startswith("You are trying to save a non contiguous tensor: `t` which is not allowed.")
