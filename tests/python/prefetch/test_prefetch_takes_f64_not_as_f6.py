"""Bug (41ab60a): prefetch refused F64 tensors as if they were F6 (its F6 check matched the code "F64" by the
prefix "F6"). F64 tensors prefetch whole and by rows, on both backends, equal to get_tensor; F6 stays refused.
test_prefetch.py's shared state dict keeps an F64 tensor too, so every prefetch test meets one."""

from __future__ import annotations

import pytest
import torch

from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file


@pytest.mark.parametrize("backend", ["mmap", "pread"])
def test_f64_tensors_prefetch_whole_and_by_rows(tmp_path, backend):
    g = torch.Generator().manual_seed(41)
    tensors = {"double": torch.randn(5, 3, generator=g, dtype=torch.float64), "f32": torch.ones(2)}
    path = tmp_path / "f64.safetensors"
    save_file(tensors, path)
    with safe_open(path, "pt", backend=backend) as f:
        assert f.get_tensor_meta("double").dtype == "F64"
        with f.prefetch() as loader:
            got = loader.take("double")
        assert got.dtype == torch.float64 and torch.equal(got, tensors["double"])
        with f.prefetch({"double": slice(1, 4)}) as loader:
            rows = loader.take("double")
        assert torch.equal(rows, tensors["double"][1:4])


def test_f6_is_still_refused(tmp_path):
    header = b'{"x":{"dtype":"F6_E3M2","shape":[4],"data_offsets":[0,3]}}'
    header += b" " * (-len(header) % 8)
    path = tmp_path / "f6.safetensors"
    path.write_bytes(len(header).to_bytes(8, "little") + header + bytes(3))
    with safe_open(path, "pt") as f, pytest.raises(SafetensorError, match="F6_E3M2"):
        f.prefetch()
