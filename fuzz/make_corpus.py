#!/usr/bin/env python3
"""Writes the fuzz seed corpus: fuzz/corpus/{header,read,roundtrip}/ (whole files, valid and invalid),
fuzz/corpus/slice/ (encoded slice cases, see slice_fuzzer.cc) and fuzz/corpus/fault/ (a fault plan before a
file, see fault_fuzzer.cc). Deterministic: running it again rewrites the
same files. Needs only the standard library.

    python fuzz/make_corpus.py            # rewrite the committed seeds
"""

from __future__ import annotations

import hashlib
import json
import shutil
import struct
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

ROOT = Path(__file__).resolve().parent / "corpus"

# code -> bits, in rank order (COMPAT.md section 1).
DTYPES: Dict[str, int] = {
    "BOOL": 8, "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8,
    "F8_E8M0": 8, "F8_E4M3FNUZ": 8, "F8_E5M2FNUZ": 8, "I16": 16, "U16": 16, "F16": 16, "BF16": 16,
    "I32": 32, "U32": 32, "F32": 32, "C64": 64, "F64": 64, "I64": 64, "U64": 64,
}
CODES = list(DTYPES)


def nbytes(code: str, shape: Sequence[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n * DTYPES[code] // 8


def pattern(n: int, salt: int) -> bytes:
    out = bytearray()
    while len(out) < n:
        out += hashlib.sha256(f"{salt}:{len(out)}".encode()).digest()
    return bytes(out[:n])


def raw(header: bytes, data: bytes = b"", declared: Optional[int] = None) -> bytes:
    return struct.pack("<Q", len(header) if declared is None else declared) + header + data


def canonical(tensors: Sequence[Tuple[str, str, Sequence[int]]], metadata: Optional[Dict[str, str]] = None,
              salt: int = 0) -> bytes:
    """A file laid out as the writer lays it out: rank descending, then name; compact JSON padded to 8."""
    order = sorted(tensors, key=lambda t: (-CODES.index(t[1]), t[0].encode()))
    header: Dict[str, object] = {}
    if metadata is not None:
        header["__metadata__"] = metadata
    data = b""
    for name, code, shape in order:
        size = nbytes(code, shape)
        header[name] = {"dtype": code, "shape": list(shape), "data_offsets": [len(data), len(data) + size]}
        data += pattern(size, salt + len(data))
    text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode()
    text += b" " * (-len(text) % 8)
    return raw(text, data)


def entry(code: str, shape: Sequence[int], begin: int, end: int) -> str:
    return json.dumps({"dtype": code, "shape": list(shape), "data_offsets": [begin, end]}, separators=(",", ":"))


def file_seeds() -> Dict[str, bytes]:
    seeds: Dict[str, bytes] = {}
    seeds["empty"] = canonical([])
    seeds["empty_metadata"] = canonical([], metadata={})
    seeds["every_dtype"] = canonical(
        [(f"t_{c.lower()}", c, [2, 4] if DTYPES[c] < 8 else [2, 3]) for c in CODES], metadata={"format": "pt"})
    for code in ("F32", "BF16", "F4", "F6_E2M3", "BOOL", "C64", "U64"):
        shape = [4, 4] if DTYPES[code] < 8 else [3, 2, 2]
        seeds[f"one_{code.lower()}"] = canonical([("weight", code, shape)], salt=len(seeds))
    seeds["scalar_and_empty"] = canonical([("s", "F64", []), ("e", "F32", [0, 3]), ("z", "I8", [5, 0])])
    seeds["zero_size_at_one_offset"] = canonical([("a", "U8", [0]), ("b", "U8", [0]), ("c", "U8", [2]), ("d", "U8", [0])])
    seeds["metadata_escapes"] = canonical(
        [("x", "F16", [2])], metadata={"q\"b\\s": "line\nbreak\ttab\u0001", "unicode": "h\u00e9llo \u2603 \U0001f600"})
    seeds["names_escapes"] = canonical(
        [("a\u0000b", "U8", [1]), ("new\nline", "U8", [1]), ("\u00e9\U0001f600", "U8", [1]), ("", "U8", [1])])
    seeds["model_like"] = canonical(
        [(f"layers.{i}.{p}", "BF16", [4, 4] if p == "weight" else [4]) for i in range(3) for p in ("weight", "bias")]
        + [("embed.weight", "F32", [8, 2])],
        metadata={"format": "pt", "total": "3"})
    # Accepted but not canonical: header order differs from data order, unknown fields, whitespace, null metadata.
    hdr = ('{"b":' + entry("U8", [2], 4, 6) + ',"a":' + entry("F32", [1], 0, 4) + "}").encode()
    seeds["out_of_order"] = raw(hdr, pattern(6, 1))
    hdr = b' \n{"__metadata__":null,"a":{"extra":[1,{"x":2}],"dtype":"I16","shape":[2],"data_offsets":[0,4]}}\t '
    seeds["unknown_fields_whitespace"] = raw(hdr, pattern(4, 2))
    seeds["odd_header_length"] = raw(b'{"a":' + entry("U8", [3], 0, 3).encode() + b"}", b"abc")

    # Rejected, one or two per error kind and per malicious class.
    seeds["bad_too_small"] = b"\x05\x00\x00"
    seeds["bad_too_large"] = raw(b"{}", declared=100_000_001)
    seeds["bad_length_past_eof"] = raw(b"{}", declared=64)
    seeds["bad_utf8"] = raw(b'{"\xff":' + entry("U8", [1], 0, 1).encode() + b"}", b"x")
    seeds["bad_json_truncated"] = raw(b'{"a":{"dtype":"U8","sha')
    seeds["bad_nul_padding"] = raw(b"{}\x00\x00\x00\x00\x00\x00")
    seeds["bad_unknown_dtype"] = raw(b'{"a":' + entry("F128", [1], 0, 16).encode() + b"}", bytes(16))
    seeds["bad_duplicate_key"] = raw(b'{"a":' + entry("U8", [1], 0, 1).encode() + b',"a":' + entry("U8", [1], 0, 1).encode() + b"}", b"x")
    seeds["bad_duplicate_metadata"] = raw(b'{"__metadata__":{},"__metadata__":{}}')
    seeds["bad_metadata_value"] = raw(b'{"__metadata__":{"n":1}}')
    seeds["bad_negative_and_fraction"] = raw(b'{"a":{"dtype":"U8","shape":[-1, 2.5],"data_offsets":[0,1e0]}}', b"x")
    seeds["bad_huge_number"] = raw(b'{"a":{"dtype":"U8","shape":[18446744073709551616],"data_offsets":[0,1]}}', b"x")
    seeds["bad_deep"] = raw(b'{"a":' + b"[" * 2000 + b"]" * 2000 + b"}")
    seeds["bad_overlap"] = raw(('{"a":' + entry("U8", [4], 0, 4) + ',"b":' + entry("U8", [4], 2, 6) + "}").encode(), bytes(6))
    seeds["bad_gap"] = raw(('{"a":' + entry("U8", [2], 0, 2) + ',"b":' + entry("U8", [2], 3, 5) + "}").encode(), bytes(5))
    seeds["bad_trailing"] = raw(('{"a":' + entry("U8", [2], 0, 2) + "}").encode(), bytes(9))
    seeds["bad_offset_past_eof"] = raw(('{"a":' + entry("U8", [8], 0, 8) + "}").encode(), bytes(3))
    seeds["bad_end_before_begin"] = raw(('{"a":' + entry("U8", [0], 4, 0) + "}").encode())
    seeds["bad_shape_overflow"] = raw(('{"a":' + entry("U8", [1 << 32, 1 << 32], 0, 1) + "}").encode(), b"x")
    seeds["bad_bits_overflow"] = raw(('{"a":' + entry("U64", [1 << 61], 0, 8) + "}").encode(), bytes(8))
    seeds["bad_misaligned"] = raw(('{"a":' + entry("F4", [3], 0, 1) + "}").encode(), b"x")
    seeds["bad_info"] = raw(('{"a":' + entry("F32", [3], 0, 4) + "}").encode(), bytes(4))
    seeds["not_pickle"] = b"\x80\x04\x95\x10\x00\x00\x00\x00\x00\x00\x00}\x94\x8c\x01a\x94K\x01s."
    seeds["not_zip"] = b"PK\x03\x04\x14\x00\x00\x00\x08\x00" + bytes(20)
    seeds["not_lfs_pointer"] = b"version https://git-lfs.github.com/spec/v1\noid sha256:" + b"0" * 64 + b"\nsize 1234\n"
    seeds["not_html"] = b"<!DOCTYPE html>\n<html><body>Not Found</body></html>\n"
    return seeds


def read_only_seeds() -> Dict[str, bytes]:
    """Tensors larger than the pread path's 4 KiB coalescing gap, so slices also take the uncoalesced path."""
    return {
        "wide_rows": canonical([("w", "U8", [3, 5000])], salt=7),
        "tall_f32": canonical([("t", "F32", [64, 40]), ("b", "F32", [40])], salt=9),
    }


# --- slice cases (must match slice_fuzzer.cc's decoder) --------------------------------------------------

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


def enc_i64(v: int) -> bytes:
    if -12 <= v <= 12:
        return bytes([v + 12])
    special = {INT64_MIN: 0xE0, INT64_MAX: 0xE1, INT64_MIN + 1: 0xE2, INT64_MAX - 1: 0xE3}
    if v in special:
        return bytes([special[v]])
    return bytes([0xE5]) + struct.pack("<q", v)


Index = object  # int | slice | Ellipsis


def enc_index(ix: Index) -> bytes:
    if ix is Ellipsis:
        return bytes([7])
    if isinstance(ix, int):
        return bytes([0]) + enc_i64(ix)
    assert isinstance(ix, slice)
    present = (ix.start is not None) | (ix.stop is not None) << 1 | (ix.step is not None) << 2
    out = bytes([3, present])
    for v in (ix.start, ix.stop, ix.step):
        if v is not None:
            out += enc_i64(v)
    return out


def enc_slice_case(code: str, shape: Sequence[int], indices: Iterable[Index], huge: bool = False) -> bytes:
    indices = list(indices)
    out = bytes([0x80 if huge else 0, CODES.index(code), len(shape)])
    for d in shape:
        if not huge:
            assert 0 <= d <= 6
            out += bytes([d])
        elif d < 9:
            out += bytes([d])
        else:
            out += bytes([0xC0]) + struct.pack("<Q", d)
    # The decoder takes count % (ndim + 3).
    assert len(indices) < len(shape) + 3
    out += bytes([len(indices)])
    for ix in indices:
        out += enc_index(ix)
    return out


def slice_seeds() -> Dict[str, bytes]:
    E = Ellipsis
    cases: List[Tuple[str, Sequence[int], List[Index], bool]] = [
        ("F32", [4, 5], [], False),
        ("F32", [4, 5], [1], False),
        ("F32", [4, 5], [-1, slice(None, None, -2)], False),
        ("I16", [3, 4, 5], [E, 2], False),
        ("I16", [3, 4, 5], [slice(1, None), E, slice(None, None, 2)], False),
        ("U8", [6, 6], [slice(-2, -6, -1), slice(1, 5, 3)], False),
        ("U8", [6], [slice(-100, 100)], False),
        ("U8", [6], [slice(None, None, 0)], False),
        ("U8", [6], [7], False),
        ("U8", [6], [-7], False),
        ("U8", [2, 2], [0, 0, 0], False),
        ("U8", [2, 2], [E, E], False),
        ("BF16", [0, 3], [slice(None), 1], False),
        ("F64", [], [], False),
        ("F64", [], [E], False),
        ("C64", [2, 3], [slice(INT64_MIN, INT64_MAX)], False),
        ("C64", [2, 3], [slice(INT64_MAX, INT64_MIN, -1)], False),
        ("C64", [2, 3], [slice(None, None, INT64_MIN)], False),
        ("F4", [4, 4], [slice(1, 3)], False),
        ("F4", [4, 4], [slice(None), slice(1, 3)], False),
        ("F4", [4, 4], [slice(None), slice(None, None, 2)], False),
        ("F6_E3M2", [4, 4], [slice(None), slice(None, 4)], False),
        ("F6_E2M3", [2, 1, 2], [slice(None), slice(None, None, -1), slice(None)], False),
        ("F6_E3M2", [2, 1, 2], [slice(None), slice(None, None, 3), slice(None)], False),
        ("F6_E2M3", [4, 6], [slice(2, None, 2)], False),
        ("BOOL", [5, 6], [slice(None, None, -1), slice(None, None, -1)], False),
        ("U64", [3, 3, 3, 3], [1, E, slice(None, None, 2)], False),
        ("U64", [1 << 40, 1 << 30], [5], True),
        ("U8", [1 << 62, 4], [slice(None, None, 1 << 61)], True),
        ("U8", [1 << 60, 4], [slice(None, None, 1 << 59), slice(1, None)], True),
        ("U8", [2**64 - 1], [slice(None, None, -(2**62))], True),
        ("F4", [1 << 32, 3], [slice(1, None, 3)], True),
        ("U16", [1 << 33, 1 << 31], [], True),
    ]
    return {f"case_{i:02d}": enc_slice_case(*c) for i, c in enumerate(cases)}


# --- fault cases (must match fault_fuzzer.cc's decoder) --------------------------------------------------

NO_FAULT = 0xFFFFFFFF


def enc_fault_case(eio: int, end: int, knob: int, file: bytes) -> bytes:
    return struct.pack("<IIB", eio, end, knob) + file


def fault_seeds(files: Dict[str, bytes]) -> Dict[str, bytes]:
    """Each valid file with no fault, an EIO and an early end in its data (at the start, in the middle, at the
    last byte), and each in its header."""
    seeds: Dict[str, bytes] = {}
    for name in ("model_like", "every_dtype", "scalar_and_empty", "zero_size_at_one_offset", "wide_rows",
                 "tall_f32", "one_f4"):
        file = files[name]
        data_offset = 8 + struct.unpack("<Q", file[:8])[0]
        middle = (data_offset + len(file)) // 2
        cases = {
            "none": (NO_FAULT, NO_FAULT),
            "eio_first_data_byte": (data_offset, NO_FAULT),
            "eio_middle": (middle, NO_FAULT),
            "eio_last_byte": (len(file) - 1, NO_FAULT),
            "end_middle": (NO_FAULT, middle),
            "end_one_short": (NO_FAULT, len(file) - 1),
            "eio_header": (3, NO_FAULT),
            "end_in_header": (NO_FAULT, data_offset - 1),
            "both": (middle, len(file) - 1),
        }
        for i, (case, (eio, end)) in enumerate(cases.items()):
            seeds[f"{name}_{case}"] = enc_fault_case(eio, end, i, file)
    return seeds


def write(dirname: str, seeds: Dict[str, bytes]) -> None:
    d = ROOT / dirname
    if d.exists():
        shutil.rmtree(d)
    d.mkdir(parents=True)
    for name, data in seeds.items():
        (d / name).write_bytes(data)


def main() -> None:
    files = file_seeds()
    write("header", files)
    write("roundtrip", files)
    write("read", {**files, **read_only_seeds()})
    write("fault", fault_seeds({**files, **read_only_seeds()}))
    write("slice", slice_seeds())
    total = sum(p.stat().st_size for p in ROOT.rglob("*") if p.is_file())
    print(f"wrote {sum(1 for p in ROOT.rglob('*') if p.is_file())} seeds, {total} bytes, under {ROOT}")


if __name__ == "__main__":
    main()
