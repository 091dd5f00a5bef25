"""Hostile files, one test per class (the C++ twin is tests/cpp/malicious_test.cc).

Every file is refused with SafetensorError("Error while deserializing header: <the reference's text>...")
carrying the variant token, by safe_open on both backends, by load_file and by deserialize; the reference
refuses it with the same text (except where COMPAT.md makes us stricter); and opening it in a subprocess
under an address-space limit stays within a small multiple of the file's size, in bounded time.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Dict, List, NamedTuple, Optional

import pytest

import safetensors
from safetensors import SafetensorError, safe_open

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

# Where the reference accepts what we refuse, by design (COMPAT.md section 1: duplicate keys are an error).
REFERENCE_ACCEPTS = {
    ("duplicate_tensor_keys", "same"): "the reference keeps the last of two equal tensor keys",
    ("duplicate_tensor_keys", "escaped"): "the reference keeps the last of two equal tensor keys",
    ("duplicate_metadata", "key"): "the reference keeps the last of two equal metadata keys",
}

MILLION = 1_000_000


def million_entries_file(path: Path) -> int:
    """1,000,000 one-byte tensors in reverse offset order, whitespace up to just under the 100 MB cap, and a
    data buffer one byte short: every check runs before the refusal. Returns the file size."""
    parts = ",".join(f'"t{i}":{{"dtype":"U8","shape":[1],"data_offsets":[{i},{i + 1}]}}' for i in range(MILLION - 1, -1, -1))
    header = ("{" + parts + "}").encode()
    header += b" " * (100_000_000 - 8 - len(header))
    data = raw(header, b"\x01" * (MILLION - 1))
    path.write_bytes(data)
    return len(data)


@pytest.fixture(scope="module")
def case_files(tmp_path_factory: pytest.TempPathFactory) -> Dict[str, List[Path]]:
    root = tmp_path_factory.mktemp("malicious")
    files: Dict[str, List[Path]] = {}
    for cls, cases in CASES.items():
        files[cls] = []
        for i, case in enumerate(cases):
            p = root / f"{cls}-{i}.safetensors"
            p.write_bytes(case.data)
            files[cls].append(p)
    return files


def check_message(message: str, prefix: str, case: Case) -> None:
    assert message.startswith(prefix + REFERENCE_TEXT[case.token]), message
    assert f"({case.token})" in message, message
    assert case.says in message, message


@pytest.mark.parametrize("cls", list(CASES))
def test_refused(cls: str, case_files: Dict[str, List[Path]]) -> None:
    try:
        import safetensors.torch as st_torch
    except ImportError:
        st_torch = None
    for case, path in zip(CASES[cls], case_files[cls]):
        for backend in ("mmap", "pread"):
            with pytest.raises(SafetensorError) as e:
                with safe_open(path, "np", backend=backend):
                    pass
            check_message(str(e.value), FILE_PREFIX, case)
            assert str(path) in str(e.value), "the error does not name the file"
        if st_torch is not None:
            with pytest.raises(SafetensorError) as e:
                st_torch.load_file(path)
            check_message(str(e.value), FILE_PREFIX, case)
        with pytest.raises(SafetensorError) as e:
            safetensors.deserialize(case.data)
        check_message(str(e.value), BYTES_PREFIX, case)


def test_the_reference_refuses_them_with_the_same_text(reference, case_files: Dict[str, List[Path]]) -> None:
    paths = [str(p) for cls in CASES for p in case_files[cls]]
    messages = reference.run(
        textwrap.dedent(
            """
            from safetensors import safe_open
            result = []
            for p in paths:
                try:
                    with safe_open(p, "np"):
                        result.append(None)
                except Exception as e:
                    result.append(f"{type(e).__name__}: {e}")
            """
        ),
        paths=paths,
    )
    it = iter(messages)
    for cls, cases in CASES.items():
        for case in cases:
            message = next(it)
            if (cls, case.label) in REFERENCE_ACCEPTS:
                assert message is None, f"{cls}/{case.label}: the reference now refuses it: {message}"
                continue
            assert message is not None, f"{cls}/{case.label}: the reference accepts it"
            assert message.startswith("SafetensorError: " + FILE_PREFIX + REFERENCE_TEXT[case.token]), (cls, case.label, message)


# Runs in a fresh interpreter: imports only the package (no numpy, no torch), limits the address space,
# and for each file resets the peak-RSS counter (/proc/self/clear_refs), opens the file on both backends,
# and reports the rise of the peak over the resident size before, and the CPU time taken.
_PROBE = textwrap.dedent(
    """
    import json, resource, sys, time
    from safetensors import SafetensorError, _safetensors_cpp as cpp

    def status():
        return {l.split(":")[0]: int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith("Vm")}

    paths, budget = json.loads(sys.argv[1]), int(sys.argv[2])
    resource.setrlimit(resource.RLIMIT_AS, (status()["VmSize"] + budget,) * 2)
    out = []
    for p in paths:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        before = status()["VmRSS"]
        t0 = time.process_time()  # CPU time: a busy machine cannot push it past the bounds below
        kinds = []
        for backend in ("mmap", "pread"):
            try:
                cpp.File(p, backend)
                kinds.append("accepted")
            except SafetensorError as e:
                kinds.append(str(e)[:300])
        out.append({"path": p, "rise": status()["VmHWM"] - before, "seconds": time.process_time() - t0, "kinds": kinds})
    print(json.dumps(out))
    """
)


def probe(paths: List[Path], budget: int, timeout: float) -> List[dict]:
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1")
    proc = subprocess.run(
        [sys.executable, "-c", _PROBE, json.dumps([str(p) for p in paths]), str(budget)],
        capture_output=True, text=True, timeout=timeout, env=env,
    )
    assert proc.returncode == 0, f"the probe died (rc {proc.returncode}):\n{proc.stderr[-3000:]}"
    return json.loads(proc.stdout)


def test_bounded_memory_and_time(case_files: Dict[str, List[Path]]) -> None:
    # 64 MiB of address space covers the parser's reservations for the largest of these files (about 16
    # bytes per byte of a 1 MB header); trusting any declared size (up to 10^8 or 2^64) would exceed it.
    paths = [p for cls in CASES for p in case_files[cls]]
    results = probe(paths, budget=64 << 20, timeout=120)
    for r in results:
        size = os.path.getsize(r["path"])
        assert all(k.startswith("Error while deserializing header: ") for k in r["kinds"]), r
        assert r["kinds"][0] == r["kinds"][1], r
        assert r["rise"] <= 8 * size + (4 << 20), f"{r['path']}: resident memory rose {r['rise']} for {size} bytes"
        assert r["seconds"] < 10, r


def test_million_tiny_entries_near_the_cap(tmp_path: Path) -> None:
    path = tmp_path / "million.safetensors"
    size = million_entries_file(path)
    # Address space: the parser reserves about 16 bytes per header byte (mostly never touched), plus the
    # mapping of the file itself. Resident memory: at most 8 bytes per byte of the file.
    [r] = probe([path], budget=20 * size, timeout=240)
    for message in r["kinds"]:
        assert message.startswith(
            "Error while deserializing header: incomplete metadata, file not fully covered: "
            "the tensors cover 1000000 bytes of a 999999-byte data buffer (MetadataIncompleteBuffer)"
        ), r
    assert r["rise"] <= 8 * size, f"resident memory rose {r['rise']} for a {size}-byte file"
    assert r["seconds"] < 120, r


# A NUL in a name or dtype keeps the whole error text: test_error_text_keeps_nul_bytes.py.
