"""Bug (1067a62, found by the malicious-file corpus): a NUL inside a tensor name or dtype cut the Python error
message short (PyErr_SetString stops at the first NUL), dropping the variant token and the path. Errors are
raised with their whole text."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

import safetensors
from safetensors import SafetensorError, safe_open


def raw(header: str, data: bytes) -> bytes:
    encoded = header.encode()
    return struct.pack("<Q", len(encoded)) + encoded + data


def test_error_text_survives_nul_bytes(tmp_path: Path) -> None:
    path = tmp_path / "nul.safetensors"
    # Tensor "b\0c" begins at 3 where "a" ended at 2: an invalid offset, named with the NUL kept.
    header = ('{"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},'
              '"b\\u0000c":{"dtype":"U8","shape":[2],"data_offsets":[3,5]}}')
    path.write_bytes(raw(header, bytes(5)))
    with pytest.raises(SafetensorError) as e:
        safe_open(path, "np")
    assert str(e.value) == (f"Error while deserializing header: invalid offset for tensor `b\x00c` (InvalidOffset) "
                            f'in "{path}"')
    with pytest.raises(SafetensorError) as e:
        safetensors.deserialize(raw('{"a":{"dtype":"U8\\u0000","shape":[1],"data_offsets":[0,1]}}', b"x"))
    assert str(e.value) == ("Error while deserializing: invalid JSON in header: unknown dtype `U8\x00` for tensor "
                            "`a` (InvalidHeaderDeserialization)")
