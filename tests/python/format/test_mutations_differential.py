"""Differential accept/reject against the reference on 10,240 mutated files.

Valid files of many shapes are mutated deterministically -- bit flips and byte edits anywhere, length-prefix
edits, truncation and appended bytes, and structural edits of the header JSON (dtypes, shapes, offsets,
metadata, duplicate keys, nesting, number spellings, whitespace) -- and each result is opened by both
implementations. Both must make the same decision; a refusal must be of the same kind (the reference's
message text mapped to its variant token, ours carrying the token itself) and an acceptance must give the
same keys, metadata, dtypes, shapes and bytes. The reference runs over the whole batch in one subprocess.

The only differences allowed are the deliberate ones in README.md ("Differences from the reference").
"""

from __future__ import annotations

import json
import random
import re
import struct
import textwrap
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import pytest


SEED = 20240606
COUNT = 10_240

# The reference's text for each error kind, keyed by our variant token (COMPAT.md section 2).
from malicious_files import FILE_PREFIX as PREFIX  # noqa: E402
from malicious_files import REFERENCE_TEXT  # noqa: E402

BITS = {
    "BOOL": 8, "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8,
    "F8_E8M0": 8, "F8_E4M3FNUZ": 8, "F8_E5M2FNUZ": 8, "I16": 16, "U16": 16, "F16": 16, "BF16": 16,
    "I32": 32, "U32": 32, "F32": 32, "C64": 64, "F64": 64, "I64": 64, "U64": 64,
}
CODES = list(BITS)

# --- base files ---------------------------------------------------------------------------------------

Header = List[Tuple[str, Any]]  # ordered (key, value) pairs, so duplicate keys can be written


def dumps(pairs: Header) -> str:
    return "{" + ",".join(json.dumps(k, ensure_ascii=False) + ":" + json.dumps(v, ensure_ascii=False, separators=(",", ":"))
                          for k, v in pairs) + "}"


def assemble(text: "str | bytes", data: bytes, pad: bool = True, declared: Optional[int] = None) -> bytes:
    raw = text.encode() if isinstance(text, str) else text
    if pad:
        raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw) if declared is None else declared) + raw + data


def base_files(rng: random.Random) -> List[Tuple[Header, bytes]]:
    """Valid files: every dtype, scalars, empty and zero-size tensors, metadata, non-canonical orders."""
    bases: List[Tuple[Header, bytes]] = []

    def build(tensors: List[Tuple[str, str, List[int]]], metadata: Optional[Dict[str, str]] = None,
              shuffle: bool = False) -> None:
        pairs: Header = []
        data = b""
        for name, code, shape in tensors:
            n = 1
            for d in shape:
                n *= d
            size = n * BITS[code] // 8
            pairs.append((name, {"dtype": code, "shape": shape, "data_offsets": [len(data), len(data) + size]}))
            data += bytes(rng.getrandbits(8) for _ in range(size))
        if shuffle:
            rng.shuffle(pairs)
        if metadata is not None:
            pairs.insert(rng.randrange(len(pairs) + 1) if shuffle else 0, ("__metadata__", metadata))
        bases.append((pairs, data))

    build([])
    build([], metadata={})
    for code in CODES:
        shape = [2, 4] if BITS[code] < 8 else [rng.randint(1, 3), rng.randint(1, 3)]
        build([("w", code, shape)])
    build([("a", "F32", [2, 2]), ("b", "I64", [3]), ("c", "BF16", [])], metadata={"format": "pt"})
    build([("s", "F64", []), ("e", "F32", [0, 3]), ("z", "U8", [0])])
    build([("x", "U8", [0]), ("y", "U8", [0]), ("z", "U8", [2])], shuffle=True)
    build([(f"layer.{i}.weight", rng.choice(["F16", "BF16", "F32"]), [2, 3]) for i in range(6)],
          metadata={"format": "pt", "note": "h\u00e9llo \u2603"}, shuffle=True)
    build([("a\nb", "I8", [3]), ("\u00e9", "I8", [1]), ("q\"uote", "I8", [2])], metadata={"k\\": "v\u0001"})
    build([("f4", "F4", [4]), ("f6", "F6_E3M2", [4]), ("u", "U16", [1])], shuffle=True)
    return bases


# --- mutations ----------------------------------------------------------------------------------------

INTERESTING_BYTES = b'{}[]":,0123456789-+.eE \t\n\r\x00\xff\xc3\x80\\/ua'
NUMBERS = [0, 1, 2, 3, 7, 8, 255, 2**31, 2**32, 2**53 + 1, 2**61, 2**62, 2**63 - 1, 2**63, 2**64 - 1, 2**64, -1, -0.0,
           1.0, 0.5, 1e0, 1e400, "1", None, True, [], {}]
NUMBER_SPELLINGS = ["01", "-0", "1e0", "1E2", "1.0", "0x10", "+1", " 1 ", "1_0", "Infinity", "NaN", "00"]
BAD_DTYPES = ["F128", "f32", "", "float32", "F32 ", 32, None, ["F32"], "U8\u0000", "BOOL8"]


class Mutator:
    def __init__(self, rng: random.Random, pairs: Header, data: bytes) -> None:
        self.rng = rng
        self.pairs = json.loads(json.dumps(pairs))  # deep copy, order kept
        self.data = data
        self.notes: List[str] = []

    # Structural edits of the header, re-serialized afterwards.
    def tensors(self) -> List[Tuple[int, Dict[str, Any]]]:
        return [(i, v) for i, (k, v) in enumerate(self.pairs) if k != "__metadata__" and isinstance(v, dict)]

    def edit_structure(self) -> None:
        r = self.rng
        ts = self.tensors()
        op = r.randrange(18)
        if ts and op == 0:
            _, t = r.choice(ts)
            t["dtype"] = r.choice(CODES + BAD_DTYPES)
            self.notes.append(f"dtype={t['dtype']!r}")
        elif ts and op == 1:
            _, t = r.choice(ts)
            if isinstance(t.get("shape"), list) and t["shape"]:
                i = r.randrange(len(t["shape"]))
                d = t["shape"][i] if type(t["shape"][i]) is int else 1
                t["shape"][i] = r.choice(NUMBERS + [d + 1, max(d - 1, 0)])
            else:
                t["shape"] = [r.choice(NUMBERS)]
            self.notes.append(f"shape={t['shape']!r}")
        elif ts and op == 2:
            _, t = r.choice(ts)
            shape = t.get("shape") if isinstance(t.get("shape"), list) else []
            t["shape"] = r.choice([[], [0], shape + [1], shape[1:], "[1]", None, {}])
            self.notes.append(f"shape={t['shape']!r}")
        elif ts and op == 3:
            _, t = r.choice(ts)
            off = t.get("data_offsets")
            if not (isinstance(off, list) and len(off) == 2 and all(type(v) is int for v in off)):
                off = [0, 0]
            t["data_offsets"] = r.choice([
                [off[1], off[0]], [off[0] + 1, off[1] + 1], [off[0], off[1] + 1], [off[0], off[1] - 1],
                [off[0], 2**64 - 1], [2**63, 2**63], [off[0]], [off[0], off[1], off[1]], [-1, off[1]],
                [float(off[0]), off[1]], [str(off[0]), off[1]], None, [off[0], 2**64],
            ])
            self.notes.append(f"data_offsets={t['data_offsets']!r}")
        elif len(ts) >= 2 and op == 4:
            (_, a), (_, b) = r.sample(ts, 2)
            a["data_offsets"], b["data_offsets"] = b.get("data_offsets"), a.get("data_offsets")
            self.notes.append("swap offsets")
        elif ts and op == 5:
            i, _ = r.choice(ts)
            self.notes.append(f"drop {self.pairs[i][0]!r}")
            del self.pairs[i]
        elif ts and op == 6:
            i, t = r.choice(ts)
            dup = json.loads(json.dumps(t))
            if r.random() < 0.5:
                dup["dtype"] = r.choice(CODES)
            self.pairs.insert(r.randrange(len(self.pairs) + 1), (self.pairs[i][0], dup))
            self.notes.append(f"duplicate key {self.pairs[i][0]!r}")
        elif op == 7:
            md = r.choice([{"a": "1"}, {"a": 1}, {"a": None}, {"a": ["x"]}, {"a": {"b": "c"}}, None, [], "x", 1, {}])
            self.pairs.insert(r.randrange(len(self.pairs) + 1), ("__metadata__", md))
            self.notes.append(f"__metadata__={md!r}")
        elif ts and op == 8:
            _, t = r.choice(ts)
            t[r.choice(["extra", "dtype2", "offsets", "Shape"])] = r.choice([1, "x", None, [1, [2]], {"d": {}}])
            self.notes.append("unknown field")
        elif ts and op == 9:
            _, t = r.choice(ts)
            field = r.choice(["dtype", "shape", "data_offsets"])
            t.pop(field, None)
            self.notes.append(f"remove {field}")
        elif ts and op == 10:
            i, _ = r.choice(ts)
            self.pairs[i] = (self.pairs[i][0], r.choice([[1, 2], "F32", 3, None, True, {}]))
            self.notes.append("entry not an object")
        elif ts and op == 11:
            i, t = r.choice(ts)
            self.pairs[i] = (r.choice(["__metadata__", "", "\u0000", "a" * 300, "\ud7ff", "x.y"]), t)
            self.notes.append(f"rename to {self.pairs[i][0]!r}")
        elif ts and op == 12:
            _, t = r.choice(ts)
            depth = r.choice([10, 100, 126, 127, 128, 129, 200, 1000, 1100])
            t["extra"] = f"@@deep{depth}@@"  # spliced in as text: Python's json module recurses
            self.notes.append(f"nesting depth {depth}")
        elif op == 13:
            self.pairs.append((r.choice(["a", "b", "w", "zz"]), {"dtype": "U8", "shape": [0], "data_offsets": [0, 0]}))
            self.notes.append("append zero-size tensor")
        elif ts and op == 14:
            _, t = r.choice(ts)
            n = r.randint(1, 16)
            t["shape"] = [n]
            t["dtype"] = "U8"
            self.notes.append(f"retype U8[{n}]")
        elif op == 15:
            md = next((v for k, v in self.pairs if k == "__metadata__" and isinstance(v, dict)), None)
            if md is not None:
                md[r.choice(["a", "format", "\u00e9", ""])] = r.choice(["v", "", "\u0000", 1])
                self.notes.append("edit metadata")
        elif ts and op == 16:
            _, t = r.choice(ts)
            t["dtype"] = r.choice(CODES)
            self.notes.append(f"dtype={t['dtype']}")
        else:
            self.notes.append("no structural edit")

    def header_text(self) -> str:
        text = re.sub(r'"@@deep(\d+)@@"', lambda m: "[" * int(m[1]) + "]" * int(m[1]), dumps(self.pairs))
        r = self.rng
        choice = r.randrange(12)
        if choice == 0:
            # Respell one number.
            numbers = [m for m in range(len(text)) if text[m].isdigit() and (m == 0 or not text[m - 1].isdigit())]
            if numbers:
                m = r.choice(numbers)
                end = m
                while end < len(text) and text[end].isdigit():
                    end += 1
                spelling = r.choice(NUMBER_SPELLINGS)
                text = text[:m] + spelling + text[end:]
                self.notes.append(f"number spelled {spelling!r}")
        elif choice == 1:
            ws = r.choice([" ", "\t", "\n", "\r\n", "\u00a0", "\ufeff", "\x0b", "\x0c"])
            text = (ws + text) if r.random() < 0.5 else (text + ws)
            self.notes.append(f"whitespace {ws!r}")
        elif choice == 2:
            for old, new in [('"F', '"\\u0046'), ('"a', '"\\u0061'), ('"w', '"\\ud800w'), ('"dtype"', '"d\\u0074ype"')]:
                if old in text and r.random() < 0.5:
                    text = text.replace(old, new, 1)
                    self.notes.append(f"escape {new!r}")
        return text

    def build(self) -> bytes:
        if self.rng.random() < 0.8:
            self.edit_structure()
        if self.rng.random() < 0.2:
            self.edit_structure()
        text = self.header_text().encode("utf-8", "surrogatepass")
        r = self.rng
        pad = r.random() < 0.8
        if r.random() < 0.15:
            text += r.choice([b"\x00" * r.randint(1, 7), b" " * r.randint(1, 9), b"\n"])
            self.notes.append("tail bytes in header")
        out = bytearray(assemble(text, self.data, pad=pad))
        header_end = struct.unpack("<Q", out[:8])[0] + 8
        for _ in range(r.choice([0, 0, 0, 1, 1, 2, 4])):
            kind = r.randrange(7)
            if kind == 0 and len(out):
                p = r.randrange(min(len(out), header_end + 1))
                out[p] ^= 1 << r.randrange(8)
                self.notes.append(f"flip bit at {p}")
            elif kind == 1 and len(out) > 8:
                p = r.randrange(8, min(len(out), header_end + 1))
                out[p] = r.choice(INTERESTING_BYTES)
                self.notes.append(f"byte {out[p]:#x} at {p}")
            elif kind == 2 and len(out) >= 8:
                n = struct.unpack("<Q", out[:8])[0]
                n = r.choice([n + r.randint(-9, 9), 0, 2**64 - 1, 100_000_001, 100_000_000, len(out), len(out) - 8])
                out[:8] = struct.pack("<Q", max(0, min(n, 2**64 - 1)))
                self.notes.append(f"length {n}")
            elif kind == 3 and len(out):
                cut = r.randrange(len(out))
                del out[cut:]
                self.notes.append(f"truncate at {cut}")
            elif kind == 4:
                extra = bytes(r.getrandbits(8) for _ in range(r.randint(1, 16)))
                out += extra
                self.notes.append(f"append {len(extra)}")
            elif kind == 5 and header_end < len(out):
                p = r.randrange(header_end, len(out))
                out[p] ^= 0xFF
                self.notes.append(f"data flip at {p}")
            elif kind == 6 and 8 < header_end <= len(out):
                p = r.randrange(8, header_end)
                n = r.randint(1, 4)
                if r.random() < 0.5:
                    del out[p:p + n]
                else:
                    out[p:p] = bytes(r.choice(INTERESTING_BYTES) for _ in range(n))
                self.notes.append(f"splice {n} at {p}")
        return bytes(out)


def mutated_files(directory: Path) -> List[Tuple[Path, str]]:
    rng = random.Random(SEED)
    bases = base_files(rng)
    out = []
    for i in range(COUNT):
        pairs, data = bases[i % len(bases)]
        m = Mutator(rng, pairs, data)
        blob = m.build()
        path = directory / f"m{i:05d}.safetensors"
        path.write_bytes(blob)
        out.append((path, f"base {i % len(bases)}: " + "; ".join(m.notes)))
    return out


# --- classification -----------------------------------------------------------------------------------

# Runs in the reference's interpreter (and is executed here for ours): a verdict per file.
CLASSIFY = textwrap.dedent(
    """
    import hashlib
    from safetensors import safe_open, deserialize

    def classify(path):
        try:
            with safe_open(path, "np") as f:
                keys, metadata = f.keys(), f.metadata()
        except Exception as e:
            return ("refused", type(e).__name__, str(e))
        with open(path, "rb") as fh:
            tensors = sorted(
                (name, info["dtype"], list(info["shape"]), hashlib.sha1(bytes(info["data"])).hexdigest())
                for name, info in deserialize(fh.read())
            )
        return ("accepted", sorted(keys), metadata, tensors)

    result = [classify(p) for p in paths]
    """
)


def reference_kind(message: str) -> str:
    assert message.startswith(PREFIX), message
    text = message[len(PREFIX):]
    for token, ref in REFERENCE_TEXT.items():
        if text.startswith(ref):
            return token
    return "unknown: " + text


def our_kind(message: str) -> str:
    token = next((t for t in REFERENCE_TEXT if f"({t})" in message), None)
    assert token is not None, f"no variant token in {message!r}"
    assert message.startswith(PREFIX + REFERENCE_TEXT[token]), f"text does not match the token: {message!r}"
    return token


def tied_entries(path: Path) -> bool:
    """True when two tensor entries of the file's header declare the same non-empty data_offsets."""
    data = path.read_bytes()
    try:
        n = struct.unpack("<Q", data[:8])[0]
        pairs = json.loads(data[8:8 + n], object_pairs_hook=list)
    except (struct.error, ValueError, RecursionError):
        return False
    seen = set()
    for key, value in pairs if isinstance(pairs, list) else []:
        offsets = dict(value).get("data_offsets") if isinstance(value, list) and key != "__metadata__" else None
        if isinstance(offsets, list) and len(offsets) == 2 and offsets[0] != offsets[1]:
            if tuple(map(str, offsets)) in seen:
                return True
            seen.add(tuple(map(str, offsets)))
    return False


def explain(ours: tuple, theirs: tuple, path: Path) -> Optional[str]:
    """The documented reason for a difference (README.md, "Differences from the reference"), or None."""
    if ours[0] == "refused" and ours[1] == "InvalidHeaderDeserialization":
        # The reference keeps the last of two equal keys, then accepts the file or meets a later error.
        if "duplicate tensor name" in ours[2]:
            return "duplicate tensor names"
        if "in `__metadata__`" in ours[2] and "duplicate key" in ours[2]:
            return "duplicate metadata keys"
    if ours[0] == theirs[0] == "refused" and {ours[1], theirs[1]} <= {"InvalidOffset", "TensorInvalidInfo"}:
        # Entries with equal offsets: the reference walks them in its hash map's order, which changes from run
        # to run, so which of the two it blames (and with which kind) does too; we walk them in header order.
        if tied_entries(path):
            return "entries with equal data_offsets"
    return None


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> List[Tuple[Path, str]]:
    return mutated_files(tmp_path_factory.mktemp("mutations"))


def test_mutated_files_are_decided_like_the_reference(reference, corpus: List[Tuple[Path, str]]) -> None:
    paths = [str(p) for p, _ in corpus]
    theirs = reference.run(CLASSIFY, paths=paths)
    scope: Dict[str, Any] = {"paths": paths}
    exec(CLASSIFY, scope)
    ours = scope["result"]
    assert len(ours) == len(theirs) == COUNT

    accepted = sum(1 for o in ours if o[0] == "accepted")
    unexplained: List[str] = []
    explained: Dict[str, int] = {}
    for (path, notes), o, t in zip(corpus, ours, theirs):
        if o[0] == "refused":
            assert o[1] == "SafetensorError", o
            o = (o[0], our_kind(o[2]), o[2])
        if t[0] == "refused":
            assert t[1] == "SafetensorError", t
            t = (t[0], reference_kind(t[2]), t[2])
        if o[:2] == t[:2] and (o[0] == "refused" or o == t):
            continue
        reason = explain(o, t, path)
        if reason is not None:
            explained[reason] = explained.get(reason, 0) + 1
            continue
        unexplained.append(f"{path.name} ({notes}):\n    ours:      {o}\n    reference: {t}")
    print(f"\n{COUNT} files: {accepted} accepted by us, {sum(explained.values())} explained differences {explained}")
    assert not unexplained, f"{len(unexplained)} unexplained differences:\n" + "\n".join(unexplained[:40])
    # The batch exercises both decisions and every kind the format defines but the slice one.
    assert 0.1 * COUNT < accepted < 0.9 * COUNT, accepted
    kinds = {our_kind(o[2]) for o in ours if o[0] == "refused"}
    assert kinds >= set(REFERENCE_TEXT) - {"MisalignedSlice"}, kinds
