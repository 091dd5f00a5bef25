"""Hostile files, one test per class (the C++ twin is tests/cpp/malicious_test.cc).

Every file is refused with SafetensorError("Error while deserializing header: <the reference's text>...")
carrying the variant token, by safe_open on both backends, by load_file and by deserialize; the reference
refuses it with the same text (except where COMPAT.md makes us stricter); and opening it in a subprocess
under an address-space limit stays within a small multiple of the file's size, in bounded time.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Dict, List

import pytest

import safetensors
from safetensors import SafetensorError, safe_open

from malicious_files import BYTES_PREFIX, CASES, FILE_PREFIX, REFERENCE_TEXT, Case, raw  # noqa: E402

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
def test_each_hostile_file_is_refused_with_the_reference_text_on_every_path(cls: str, case_files: Dict[str, List[Path]]) -> None:
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
