"""Differential tests against the reference implementation (safetensors==0.8.0 in .ref, run in a subprocess):
over many generated state dicts our bytes equal the reference's and each library loads the other's files to
equal tensors; both reject the same malformed files with the same kind of error."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from safetensors import SafetensorError, safe_open
from safetensors.torch import load, save

# Every torch dtype both libraries can save and load (the reference's loader lacks F8_E8M0 and F4).
TORCH_DTYPES = [
    torch.bool, torch.uint8, torch.int8, torch.int16, torch.uint16, torch.int32, torch.uint32, torch.int64,
    torch.uint64, torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.complex64,
    torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e4m3fnuz, torch.float8_e5m2fnuz,
]

NAMES = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",), min_codepoint=1), min_size=1, max_size=12
).filter(lambda s: s != "__metadata__")


@st.composite
def state_dicts(draw):
    n = draw(st.integers(0, 8))
    names = draw(st.lists(NAMES, min_size=n, max_size=n, unique=True))
    out = {}
    for _i, name in enumerate(names):
        dtype = draw(st.sampled_from(TORCH_DTYPES))
        shape = tuple(draw(st.lists(st.integers(0, 4), max_size=3)))
        numel = int(np.prod(shape, dtype=np.int64))
        data = draw(st.binary(min_size=numel * dtype.itemsize, max_size=numel * dtype.itemsize))
        t = torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else torch.empty(0, dtype=torch.uint8)
        if dtype == torch.bool:
            t = t % 2
        out[name] = t.view(dtype).reshape(shape).clone()
    # At most one metadata key: the reference writes several in a random (hash map) order. No tensors with
    # empty metadata: the reference writes invalid JSON for that (see the test below).
    metadata = draw(st.one_of(st.none(), st.dictionaries(NAMES, st.text(max_size=8), min_size=0 if out else 1, max_size=1)))
    return out, metadata


def raw(t: torch.Tensor) -> bytes:
    return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""


# Tensors cross the process boundary as (dtype name, shape, bytes): torch cannot pickle every dtype.
REF_SAVE_AND_LOAD = """
import torch
from safetensors.torch import save, load
def rebuild(spec):
    dtype, shape, data = spec
    t = torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else torch.empty(0, dtype=torch.uint8)
    return t.view(getattr(torch, dtype)).reshape(shape)
def describe(t):
    return (str(t.dtype).removeprefix("torch."), tuple(t.shape), t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
result = []
for specs, metadata, ours in cases:
    mine = save({k: rebuild(v) for k, v in specs.items()}, metadata=metadata)
    result.append((mine, {k: describe(v) for k, v in load(ours).items()}))
"""


def describe(t: torch.Tensor):
    return (str(t.dtype).removeprefix("torch."), tuple(t.shape), raw(t))


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(batch=st.lists(state_dicts(), min_size=25, max_size=25))
def test_same_bytes_and_cross_loading(reference, tmp_path, batch):
    cases = [
        ({k: describe(v) for k, v in tensors.items()}, metadata, save(tensors, metadata=metadata))
        for tensors, metadata in batch
    ]
    ref_results = reference.run(REF_SAVE_AND_LOAD, cases=cases)
    for (tensors, metadata), (_, _, ours), (theirs, ref_loaded) in zip(batch, cases, ref_results):
        assert ours == theirs  # byte-identical files
        assert ref_loaded == {k: describe(v) for k, v in tensors.items()}  # the reference loads our file
        assert {k: describe(v) for k, v in load(theirs).items()} == ref_loaded  # we load the reference's file
        path = tmp_path / "x.safetensors"
        path.write_bytes(theirs)
        with safe_open(path, "pt") as f:
            assert f.metadata() == metadata


def test_empty_dict_with_empty_metadata_is_valid_unlike_the_reference(reference):
    theirs = reference.run("from safetensors.torch import save\nresult = save({}, metadata={})")
    assert theirs[8:].startswith(b'{},"__metadata__":{}}')  # the reference's output is not JSON
    ours = save({}, metadata={})
    assert ours == b"\x18\x00\x00\x00\x00\x00\x00\x00" + b'{"__metadata__":{}}     '
    assert load(ours) == {}


def test_numpy_bytes_equal_the_reference(reference):
    arrays = {
        "f16": np.arange(6, dtype=np.float16).reshape(2, 3),
        "u64": np.array([1, 2**63], dtype=np.uint64),
        "bool": np.array([True, False, True]),
        "c64": np.array([1 + 2j], dtype=np.complex64),
        "scalar": np.array(3.5, dtype=np.float64),
        "empty": np.zeros((0, 5), dtype=np.int32),
    }
    theirs = reference.run("from safetensors.numpy import save\nresult = save(arrays, metadata={'a': 'b'})", arrays=arrays)
    from safetensors.numpy import save as np_save

    assert np_save(arrays, metadata={"a": "b"}) == theirs


# -- malformed files: same decision, same kind ---------------------------------------------------------------

def _raw_file(header, data=b"", declared=None):
    h = header if isinstance(header, bytes) else json.dumps(header, separators=(",", ":")).encode()
    return struct.pack("<Q", len(h) if declared is None else declared) + h + data


F32 = {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}
MALFORMED = {
    "too_small": b"\x01\x02",
    "too_large": struct.pack("<Q", 100_000_001) + b"{}",
    "huge_n": struct.pack("<Q", 2**64 - 1) + b"{}",
    "length_past_eof": struct.pack("<Q", 50) + b"{}",
    "utf8": _raw_file(b'{"\xff":1}'),
    "truncated_json": _raw_file(b'{"a":'),
    "empty_header": struct.pack("<Q", 0),
    "missing_field": _raw_file({"a": {"dtype": "F32", "shape": [1]}}),
    "unknown_dtype": _raw_file({"a": {"dtype": "F33", "shape": [1], "data_offsets": [0, 4]}}, b"\0" * 4),
    "negative_dim": _raw_file(b'{"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}}', b"\0" * 4),
    "float_dim": _raw_file(b'{"a":{"dtype":"F32","shape":[1.5],"data_offsets":[0,4]}}', b"\0" * 4),
    "not_object": _raw_file(b"[]"),
    "nul_padding": _raw_file(b"{}\0\0\0\0\0\0"),
    "metadata_not_string": _raw_file({"__metadata__": {"a": 1}}),
    "offset_gap": _raw_file({"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}, b"\0" * 8),
    "end_before_begin": _raw_file({"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 0]}}, b"\0" * 4),
    "overflow": _raw_file({"a": {"dtype": "F32", "shape": [2**62, 2**62], "data_offsets": [0, 4]}}, b"\0" * 4),
    "misaligned": _raw_file({"a": {"dtype": "F4", "shape": [3], "data_offsets": [0, 1]}}, b"\0" * 2),
    "wrong_size": _raw_file({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}}, b"\0" * 4),
    "trailing_bytes": _raw_file({"a": F32}, b"\0" * 5),
    "missing_bytes": _raw_file({"a": F32}, b"\0" * 3),
}

# The reference's fixed texts (after "Error while deserializing header: ") and our variant tokens.
KINDS = {
    "header too small": "HeaderTooSmall",
    "header too large": "HeaderTooLarge",
    "invalid header length": "InvalidHeaderLength",
    "invalid UTF-8 in header": "InvalidHeader",
    "invalid JSON in header": "InvalidHeaderDeserialization",
    "invalid offset for tensor": "InvalidOffset",
    "overflow computing buffer size": "ValidationOverflow",
    "The slice is slicing for subbytes dtypes": "MisalignedSlice",
    "invalid shape, data type, or offset for tensor": "TensorInvalidInfo",
    "incomplete metadata, file not fully covered": "MetadataIncompleteBuffer",
}

PREFIX = "Error while deserializing header: "


def kind_of(message: str) -> str:
    assert message.startswith(PREFIX), message
    for text, kind in KINDS.items():
        if message[len(PREFIX):].startswith(text):
            return kind
    raise AssertionError(f"unknown error text: {message}")


def test_malformed_files_fail_alike(reference, tmp_path):
    paths = {}
    for name, data in MALFORMED.items():
        paths[name] = str(tmp_path / f"{name}.safetensors")
        with open(paths[name], "wb") as fh:
            fh.write(data)
    theirs = reference.run(
        "from safetensors import safe_open\n"
        "result = {}\n"
        "for name, path in paths.items():\n"
        "    try:\n"
        "        with safe_open(path, 'np') as f: f.keys()\n"
        "        result[name] = None\n"
        "    except Exception as e:\n"
        "        result[name] = (type(e).__name__, str(e))\n",
        paths=paths,
    )
    for name, path in paths.items():
        with pytest.raises(SafetensorError) as e:
            safe_open(path, "np")
        ours = str(e.value)
        assert theirs[name] is not None and theirs[name][0] == "SafetensorError", name
        ref_kind = kind_of(theirs[name][1])
        assert kind_of(ours) == ref_kind, (name, ours, theirs[name][1])
        assert f"({ref_kind})" in ours  # the variant token downstream tools match on
        if ref_kind not in ("InvalidHeaderDeserialization", "InvalidHeader", "TensorInvalidInfo", "ValidationOverflow",
                            "MisalignedSlice", "HeaderTooLarge", "InvalidHeaderLength"):
            # Fixed texts: ours starts with the reference's whole message.
            assert ours.startswith(theirs[name][1]), (name, ours, theirs[name][1])
