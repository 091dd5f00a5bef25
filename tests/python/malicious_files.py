"""The hostile files, one list per class of defect (``CASES``), and the reference's text for each error kind:
the corpus tests/python/format/test_malicious.py opens from disk and remote/test_remote.py from a server, and
the texts format/test_mutations_differential.py checks."""

from __future__ import annotations

import struct
from typing import Dict, List, NamedTuple, Optional

# The reference's text for each error kind, keyed by the variant token our messages carry.
REFERENCE_TEXT = {
    "HeaderTooSmall": "header too small",
    "HeaderTooLarge": "header too large",
    "InvalidHeaderLength": "invalid header length",
    "InvalidHeader": "invalid UTF-8 in header",
    "InvalidHeaderDeserialization": "invalid JSON in header",
    "InvalidOffset": "invalid offset for tensor",
    "ValidationOverflow": "overflow computing buffer size from shape and/or element type",
    "MisalignedSlice": "The slice is slicing for subbytes dtypes",
    "TensorInvalidInfo": "invalid shape, data type, or offset for tensor",
    "MetadataIncompleteBuffer": "incomplete metadata, file not fully covered",
}
FILE_PREFIX = "Error while deserializing header: "
BYTES_PREFIX = "Error while deserializing: "


class Case(NamedTuple):
    label: str
    data: bytes
    token: str  # the kind, as its variant token
    says: str  # what our message must also contain


def raw(header: "bytes | str", data: bytes = b"", declared: Optional[int] = None) -> bytes:
    if isinstance(header, str):
        header = header.encode()
    return struct.pack("<Q", len(header) if declared is None else declared) + header + data


def entry(dtype: str, shape: str, begin: int, end: int) -> str:
    return f'{{"dtype":"{dtype}","shape":{shape},"data_offsets":[{begin},{end}]}}'


def one(name: str, e: str) -> str:
    return f'{{"{name}":{e}}}'


def two(a: str, b: str) -> str:
    return f'{{"a":{a},"b":{b}}}'


U8_1 = entry("U8", "[1]", 0, 1)

CASES: Dict[str, List[Case]] = {
    "header_length_past_eof": [
        Case("1000", raw("{}", declared=1000), "InvalidHeaderLength", "declared length 1000 runs past the end"),
        Case("at_cap", raw("{}", declared=100_000_000), "InvalidHeaderLength", "of the 10-byte file"),
        Case("u64_max", raw("{}", declared=2**64 - 1), "HeaderTooLarge", "exceeds the limit"),
    ],
    "overlapping_tensors": [
        Case("partial", raw(two(entry("U8", "[4]", 0, 4), entry("U8", "[4]", 2, 6)), bytes(6)), "InvalidOffset", "`b`"),
        Case("inside", raw(two(entry("U8", "[8]", 0, 8), entry("U8", "[2]", 3, 5)), bytes(8)), "InvalidOffset", "`b`"),
    ],
    "many_tensors_at_one_offset": [
        Case("100", raw("{" + ",".join(f'"t{i}":{entry("F32", "[4]", 0, 16)}' for i in range(100)) + "}", bytes(16)),
             "InvalidOffset", "`t1`"),
    ],
    "gaps": [
        Case("between", raw(two(entry("U8", "[2]", 0, 2), entry("U8", "[2]", 6, 8)), bytes(8)), "InvalidOffset", "`b`"),
        Case("before_first", raw(one("a", entry("U8", "[2]", 2, 4)), bytes(4)), "InvalidOffset", "`a`"),
    ],
    "trailing_bytes_polyglot": [
        Case("zip", raw(one("a", entry("U8", "[4]", 0, 4)), b"abcdPK\x03\x04" + bytes(26)), "MetadataIncompleteBuffer",
             "the tensors cover 4 bytes of a 34-byte data buffer"),
        Case("html", raw(one("a", entry("U8", "[4]", 0, 4)), b"abcd<html><script>alert(1)</script></html>"),
             "MetadataIncompleteBuffer", "cover 4 bytes"),
    ],
    "offsets_past_eof": [
        Case("small", raw(one("a", entry("U8", "[16]", 0, 16)), b"xy"), "MetadataIncompleteBuffer",
             "the tensors cover 16 bytes of a 2-byte data buffer"),
        Case("2^60", raw(one("a", entry("U8", f"[{2**60}]", 0, 2**60)), b"xy"), "MetadataIncompleteBuffer",
             f"cover {2**60} bytes"),
        Case("far", raw(one("a", entry("U8", "[4]", 2**62, 2**62 + 4)), b"abcd"), "InvalidOffset", "`a`"),
    ],
    "shape_product_overflow": [
        Case("2^64", raw(one("a", entry("U8", f"[{2**32},{2**32}]", 0, 4)), b"abcd"), "ValidationOverflow", "`a`"),
        Case("then_zero", raw(one("a", entry("U8", f"[{2**32},{2**32},0]", 0, 0))), "ValidationOverflow", "`a`"),
    ],
    "byte_count_overflow": [
        Case("f64", raw(one("a", entry("F64", f"[{2**61}]", 0, 8)), bytes(8)), "ValidationOverflow", "`a`"),
        Case("c64", raw(one("a", entry("C64", "[65536,65536,65536,65536]", 0, 8)), bytes(8)), "ValidationOverflow", "`a`"),
    ],
    "non_utf8": [
        Case("key", raw(b'{"a\xff":' + U8_1.encode() + b"}", b"x"), "InvalidHeader", "not valid UTF-8"),
        Case("truncated", raw(b'{"__metadata__":{"k":"\xc3"}}'), "InvalidHeader", "not valid UTF-8"),
        Case("overlong", raw(b'{"\xc0\xaf":1}'), "InvalidHeader", "not valid UTF-8"),
        Case("surrogate", raw(b'{"\xed\xa0\x80":1}'), "InvalidHeader", "not valid UTF-8"),
        Case("above_max", raw(b'{"\xf4\x90\x80\x80":1}'), "InvalidHeader", "not valid UTF-8"),
        Case("latin1", raw('{"caf\u00e9":1}'.encode("latin-1")), "InvalidHeader", "not valid UTF-8"),
    ],
    "duplicate_tensor_keys": [
        Case("same", raw(f'{{"a":{U8_1},"a":{U8_1}}}', b"x"), "InvalidHeaderDeserialization", "duplicate tensor name `a`"),
        Case("escaped", raw(f'{{"a":{U8_1},"\\u0061":{U8_1}}}', b"x"), "InvalidHeaderDeserialization",
             "duplicate tensor name `a`"),
        Case("field", raw('{"a":{"dtype":"U8","dtype":"I8","shape":[1],"data_offsets":[0,1]}}', b"x"),
             "InvalidHeaderDeserialization", "duplicate field `dtype` for tensor `a`"),
    ],
    "duplicate_metadata": [
        Case("twice", raw('{"__metadata__":{"a":"1"},"__metadata__":{"a":"2"}}'), "InvalidHeaderDeserialization",
             "duplicate key `__metadata__`"),
        Case("key", raw('{"__metadata__":{"a":"1","a":"2"}}'), "InvalidHeaderDeserialization",
             "duplicate key `a` in `__metadata__`"),
    ],
    "non_string_metadata_values": [
        *[Case(v, raw(f'{{"__metadata__":{{"k":{v}}}}}'), "InvalidHeaderDeserialization",
               "`__metadata__` value for key `k` must be a string")
          for v in ("1", "1.5", "true", "null", '["x"]', '{"x":"y"}')],
        Case("array", raw('{"__metadata__":["k","v"]}'), "InvalidHeaderDeserialization", "found an array"),
        Case("string", raw('{"__metadata__":"k=v"}'), "InvalidHeaderDeserialization", "found a string"),
    ],
    "deep_nesting": [
        Case("arrays", raw("[" * 100_000 + "]" * 100_000), "InvalidHeaderDeserialization", "too deep"),
        Case("objects", raw('{"a":' * 50_000 + "1" + "}" * 50_000), "InvalidHeaderDeserialization", "too deep"),
        Case("ignored_field", raw('{"a":{"x":' + "[" * 5000 + "]" * 5000 + ',"dtype":"U8","shape":[0],"data_offsets":[0,0]}}'),
             "InvalidHeaderDeserialization", "too deep"),
        Case("unclosed", raw("[" * 1_000_000), "InvalidHeaderDeserialization", "invalid JSON in header"),
    ],
    "huge_negative_fractional_numbers": [
        Case("2^64", raw(one("a", entry("U8", f"[{2**64}]", 0, 1)), b"x"), "InvalidHeaderDeserialization", "number"),
        Case("10^29", raw(one("a", entry("U8", "[99999999999999999999999999999]", 0, 1)), b"x"),
             "InvalidHeaderDeserialization", "invalid JSON"),
        Case("1e400", raw(one("a", entry("U8", "[1e400]", 0, 1)), b"x"), "InvalidHeaderDeserialization", "invalid JSON"),
        Case("negative", raw(one("a", entry("U8", "[-1]", 0, 1)), b"x"), "InvalidHeaderDeserialization",
             "found an integer that is negative"),
        *[Case(s, raw(one("a", entry("U8", s, 0, 1)), b"x"), "InvalidHeaderDeserialization",
               "found a floating-point number") for s in ("[1.5]", "[1.0]", "[1e0]", "[-0.0]")],
        Case("offset_fraction", raw('{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1.0]}}', b"x"),
             "InvalidHeaderDeserialization", "`data_offsets` of tensor `a` must be two non-negative integers"),
        Case("offset_negative", raw('{"a":{"dtype":"U8","shape":[1],"data_offsets":[-1,0]}}', b"x"),
             "InvalidHeaderDeserialization", "`data_offsets` of tensor `a` must be two non-negative integers"),
    ],
    "unknown_dtypes": [
        *[Case(d or "empty", raw(one("a", entry(d, "[1]", 0, 4)), b"abcd"), "InvalidHeaderDeserialization",
               "unknown dtype") for d in ("F128", "f32", "float32", "", "F32 ", "U8\\u0000")],
        Case("integer", raw('{"a":{"dtype":32,"shape":[1],"data_offsets":[0,4]}}', b"abcd"),
             "InvalidHeaderDeserialization", "`dtype` of tensor `a` must be a string"),
    ],
    "nul_bytes": [
        Case("padding", raw(f'{{"a":{U8_1}}}'.encode() + bytes(6), b"x"), "InvalidHeaderDeserialization", "invalid JSON"),
        Case("in_key", raw(b'{"a\x00b":' + U8_1.encode() + b"}", b"x"), "InvalidHeaderDeserialization", "invalid JSON"),
        Case("leading", raw(b"\x00{}"), "InvalidHeaderDeserialization", "invalid JSON"),
        Case("all_zero", bytes(64), "InvalidHeaderDeserialization", "the header is empty"),
    ],
    "not_safetensors": [
        Case("pickle", b"\x80\x02\x8a\x0a\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19.", "HeaderTooLarge", "exceeds the limit"),
        Case("zip", b"PK\x03\x04\x00\x00\x08\x08\x00\x00" + bytes(60), "HeaderTooLarge", "exceeds the limit"),
        Case("git_lfs_pointer",
             b"version https://git-lfs.github.com/spec/v1\n"
             b"oid sha256:4d7a214614ab2935c943f9e0ff69d22eadbb8f32b1258daaa5e2ca24d17e2393\nsize 12345\n",
             "HeaderTooLarge", "exceeds the limit"),
        Case("html", b"<!DOCTYPE html>\n<html><head><title>404</title></head><body>Not Found</body></html>\n",
             "HeaderTooLarge", "exceeds the limit"),
        Case("text", b"hello", "HeaderTooSmall", "header too small"),
    ],
}
