"""The API surface: every module-level name of the reference's modules exists here, with a compatible signature.

Each module is described in a subprocess (the reference's with ``PYTHONPATH`` set to its directory, ours with
the installed package), by the same describer: every module-level name, for classes their public members and
the protocol dunders they define themselves, for functions and methods ``inspect.signature``. Ours must have
each name; functions must take the same parameters (names, order, kinds, defaults), optionally followed by
extra keyword-only parameters with defaults (``fsync=False``, ...). A failure lists every problem of the module.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import pytest
from conftest import REFERENCE_PYTHON

ROOT = Path(__file__).resolve().parents[3]
REFERENCES = {"0.8.0": ROOT / ".ref", "0.9.0rc1": ROOT / ".ref-rc"}
MODULES = [
    "safetensors",
    "safetensors._safetensors_rust",
    "safetensors.torch",
    "safetensors.numpy",
    "safetensors.flax",
    "safetensors.tensorflow",
    "safetensors.paddle",
    "safetensors.mlx",
]

# Run in a fresh interpreter with argv[1] = the module. Prints one JSON object:
# {"error": ..., "missing_framework": ...} when the import fails, else {"file": ..., "names": {name: entry}}.
DESCRIBER = r'''
import importlib, inspect, json, os, sys, types

# Attributes the import system sets on every module: not part of any API.
MODULE_DUNDERS = {"__builtins__", "__cached__", "__doc__", "__file__", "__loader__", "__name__", "__package__",
                  "__path__", "__spec__", "__annotations__"}
# Protocol methods the interpreter calls: only their presence is compared (it calls them positionally).
PROTOCOL = {"__getitem__", "__setitem__", "__len__", "__iter__", "__next__", "__enter__", "__exit__",
            "__contains__", "__call__", "__repr__", "__eq__", "__hash__", "__bool__"}

def text_signature(obj):
    """Parameters parsed from a builtin's __text_signature__ (for signatures inspect cannot build)."""
    text = getattr(obj, "__text_signature__", None)
    if not text:
        return None
    inner = text.strip()[1:-1].replace("$self", "self").replace("$type", "cls")
    try:
        return inspect.signature(eval(f"lambda {inner}: None"))
    except Exception:
        return None

def params(obj, drop_first=False):
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        sig = text_signature(obj)
    if sig is None:
        return None
    ps = list(sig.parameters.values())
    if drop_first and ps and ps[0].kind in (ps[0].POSITIONAL_ONLY, ps[0].POSITIONAL_OR_KEYWORD):
        ps = ps[1:]
    return [[p.name, p.kind.name, None if p.default is p.empty else repr(p.default)] for p in ps]

def own_objects():
    """Objects of the safetensors package itself (re-exported names must stay the same objects)."""
    out = {}
    for modname in ("safetensors._safetensors_rust", "safetensors"):
        m = sys.modules.get(modname)
        for name, value in (vars(m).items() if m else ()):
            if not name.startswith("__"):
                out.setdefault(id(value), f"safetensors.{name}")
    return out

def describe(modname):
    module = importlib.import_module(modname)
    own = own_objects()
    names = {}
    for name, value in sorted(vars(module).items()):
        if name in MODULE_DUNDERS:
            continue
        entry = {"alias": own.get(id(value))}
        if inspect.ismodule(value):
            if value.__name__ == f"{modname}.{name}":
                continue  # a submodule, described on its own
            entry.update(kind="module", target=value.__name__)
            # An import of another library's module (os, np, torch, ...).
            entry["imported"] = not value.__name__.startswith("safetensors")
        elif inspect.isclass(value) or inspect.isroutine(value) or type(value).__module__ == "typing":
            origin = getattr(value, "__module__", None)
            # Defined elsewhere (typing aliases, defaultdict, jax's Array, ...) and not one of ours: an import.
            entry["imported"] = origin != modname and entry["alias"] is None
            if inspect.isclass(value):
                members = {}
                # Members it defines or inherits from classes of its own library (ours may share methods by
                # subclassing, e.g. _safe_open_handle(safe_open)); not those of object or builtin exceptions.
                own_mro = [k for k in reversed(value.__mro__)
                           if k is value or not (k is object or (issubclass(k, BaseException) and k.__module__ == "builtins"))]
                for member, attr in ((m, a) for k in own_mro for m, a in vars(k).items()):
                    if member.startswith("_") and member not in PROTOCOL:
                        continue
                    if member in PROTOCOL:
                        members[member] = {"kind": "protocol"}
                    elif callable(attr) and not isinstance(attr, (property, type)):
                        members[member] = {"kind": "method", "params": params(getattr(value, member), True)}
                    else:
                        members[member] = {"kind": "attribute"}
                has_ctor = bool(getattr(value, "__text_signature__", None)) or "__init__" in vars(value)
                entry.update(kind="class", exception=issubclass(value, BaseException), members=members,
                             ctor=params(value) if has_ctor else None)
            else:
                entry.update(kind="function", params=params(value))
        else:
            entry.update(kind="data", type=type(value).__name__, imported=False)
            if name == "__all__":
                entry["value"] = sorted(value)
        names[name] = entry
    return {"file": getattr(module, "__file__", None), "names": names}

def main():
    modname = sys.argv[1]
    try:
        out = describe(modname)
    except ImportError as e:
        missing = e.name if e.name and not e.name.startswith("safetensors") else None
        out = {"error": f"{type(e).__name__}: {e}", "missing_framework": missing}
    sys.stdout.write(json.dumps(out))
    sys.stdout.flush()
    os._exit(0)  # some frameworks' tensors abort the interpreter at exit (paddle)

main()
'''


def _describe(module: str, pythonpath: Optional[Path]) -> Dict[str, Any]:
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath)
    python = sys.executable if pythonpath is None else REFERENCE_PYTHON  # a reference runs where it was built for
    proc = subprocess.run([python, "-c", DESCRIBER, module], capture_output=True, text=True, env=env, timeout=600)
    if proc.returncode != 0 or not proc.stdout:
        raise RuntimeError(f"describing {module} failed (rc {proc.returncode}):\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout)


_CACHE: Dict[Tuple[str, Optional[str]], Dict[str, Any]] = {}


def describe(module: str, pythonpath: Optional[Path]) -> Dict[str, Any]:
    key = (module, None if pythonpath is None else str(pythonpath))
    if key not in _CACHE:
        _CACHE[key] = _describe(module, pythonpath)
    return _CACHE[key]


def _format(params: List[List[Any]]) -> str:
    out = []
    for name, kind, default in params:
        prefix = {"VAR_POSITIONAL": "*", "VAR_KEYWORD": "**"}.get(kind, "")
        text = f"{prefix}{name}" + ("" if default is None else f"={default}")
        out.append(text + ("/" if kind == "POSITIONAL_ONLY" else "") + ("*kw" if kind == "KEYWORD_ONLY" else ""))
    return "(" + ", ".join(out) + ")"


def signature_problem(ref: Optional[List[List[Any]]], ours: Optional[List[List[Any]]]) -> Optional[str]:
    """None when ``ours`` accepts every call ``ref`` accepts, the same way: the same parameters (name, kind,
    default) in the same order, then only keyword-only parameters with defaults. A reference default of
    ``Ellipsis`` (PyO3 text signatures write ``...`` for defaults they cannot spell) asks only for a default."""
    if ref is None:
        return None  # the reference's signature cannot be read: nothing to hold ours to
    if ours is None:
        return f"signature unavailable, reference {_format(ref)}"
    problems = []
    for i, (name, kind, default) in enumerate(ref):
        if i >= len(ours):
            problems.append(f"lacks parameter {name!r}")
            continue
        o_name, o_kind, o_default = ours[i]
        if (o_name, o_kind) != (name, kind):
            problems.append(f"parameter {i} is {o_name!r} ({o_kind}), reference {name!r} ({kind})")
        elif default is None and o_default is not None:
            problems.append(f"{name!r} has a default ({o_default}), reference none")
        elif default is not None and o_default is None:
            problems.append(f"{name!r} has no default, reference {default}")
        elif default not in (None, "Ellipsis") and o_default != default:
            problems.append(f"{name!r} defaults to {o_default}, reference {default}")
    for name, kind, default in ours[len(ref):]:
        if kind != "KEYWORD_ONLY" or default is None:
            problems.append(f"extra parameter {name!r} ({kind}) is not keyword-only with a default")
    if problems:
        return f"{_format(ours)} vs reference {_format(ref)}: " + "; ".join(problems)
    return None


def compare(module: str, ref: Dict[str, Any], ours: Dict[str, Any]) -> List[str]:
    """Every difference between the reference's surface of ``module`` and ours, one line each."""
    problems = []
    for name, r in ref["names"].items():
        if r.get("imported"):
            continue  # the reference module's own imports (os, sys, typing names, np, torch, defaultdict, ...)
        where = f"{module}.{name}"
        o = ours["names"].get(name)
        if o is None:
            problems.append(f"missing: {where} ({r['kind']})")
            continue
        if r["alias"] is not None:
            if o["alias"] != r["alias"]:
                problems.append(f"{where}: is {r['alias']} in the reference, here {o['alias'] or 'a different object'}")
                continue
            if module not in ("safetensors", "safetensors._safetensors_rust"):
                continue  # a re-export of the same object, compared member by member in the package itself
        kind = r["kind"]
        if kind == "module":
            if o["kind"] != "module" or o["target"] != r["target"]:
                problems.append(f"{where}: the module {r['target']} in the reference, here {o.get('target', o['kind'])}")
        elif kind == "data":
            if o["kind"] != "data" or o["type"] != r["type"]:
                problems.append(f"{where}: a {r['type']} in the reference, here a {o.get('type', o['kind'])}")
            elif "value" in r:
                lacking = sorted(set(r["value"]) - set(o.get("value", [])))
                if lacking:
                    problems.append(f"{where} lacks {lacking}")
        elif kind == "function":
            if o["kind"] == "data":
                problems.append(f"{where}: a function in the reference, here a {o['type']}")
                continue
            problem = signature_problem(r["params"], o["params"] if o["kind"] == "function" else o.get("ctor"))
            if problem:
                problems.append(f"signature: {where}{problem}")
        elif kind == "class":
            if o["kind"] != "class":
                problems.append(f"{where}: a class in the reference, here a {o['kind']}")
                continue
            if r["exception"] and not o["exception"]:
                problems.append(f"{where}: an exception class in the reference, not here")
            if r["ctor"] is not None:
                problem = signature_problem(r["ctor"], o["ctor"])
                if problem:
                    problems.append(f"signature: {where}{problem}")
            for member, rm in r["members"].items():
                om = o["members"].get(member)
                if om is None:
                    problems.append(f"missing: {where}.{member} ({rm['kind']})")
                elif rm["kind"] == "method":
                    problem = signature_problem(rm["params"], om.get("params"))
                    if problem:
                        problems.append(f"signature: {where}.{member}{problem}")
    return problems


def _reference_dir(version: str) -> Path:
    path = REFERENCES[version]
    if not (path / "safetensors" / "__init__.py").exists():
        message = f"the reference {version} is not installed in {path} (run scripts/setup.sh)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return path


@pytest.mark.parametrize("module", MODULES)
@pytest.mark.parametrize("version", sorted(REFERENCES))
def test_surface_matches_reference(version: str, module: str) -> None:
    ref = describe(module, _reference_dir(version))
    if "error" in ref:
        if ref["missing_framework"]:
            pytest.skip(f"{module}: {ref['missing_framework']} is not installed ({ref['error']})")
        pytest.fail(f"the reference's {module} does not import: {ref['error']}")
    assert ref["file"] is None or ref["file"].startswith(str(REFERENCES[version])), (
        f"the reference subprocess imported {ref['file']}, not the reference in {REFERENCES[version]}"
    )
    ours = describe(module, None)
    if "error" in ours:
        if ours["missing_framework"]:
            pytest.skip(f"{module}: {ours['missing_framework']} is not installed ({ours['error']})")
        pytest.fail(f"our {module} does not import: {ours['error']}")
    problems = compare(module, ref, ours)
    assert not problems, f"{len(problems)} difference(s) from the reference {version}:\n  " + "\n  ".join(problems)


# -- the comparison itself ---------------------------------------------------------------------------------

def _p(name: str, kind: str = "POSITIONAL_OR_KEYWORD", default: Optional[str] = None) -> List[Any]:
    return [name, kind, default]


def test_signature_rules() -> None:
    ref = [_p("tensors"), _p("filename"), _p("metadata", default="None")]
    assert signature_problem(ref, ref) is None
    assert signature_problem(ref, ref + [_p("fsync", "KEYWORD_ONLY", "False")]) is None
    assert "not keyword-only" in signature_problem(ref, ref + [_p("fsync", default="False")])
    assert "not keyword-only" in signature_problem(ref, ref + [_p("fsync", "KEYWORD_ONLY")])
    assert "lacks parameter 'metadata'" in signature_problem(ref, ref[:2])
    assert "reference 'filename'" in signature_problem(ref, [ref[0], _p("path"), ref[2]])
    assert "defaults to 'x'" in signature_problem(ref, ref[:2] + [_p("metadata", default="'x'")])
    assert "KEYWORD_ONLY" in signature_problem(ref, ref[:2] + [_p("metadata", "KEYWORD_ONLY", "None")])
    # PyO3's "device=..." only asks for some default.
    assert signature_problem([_p("device", default="Ellipsis")], [_p("device", default="'cpu'")]) is None
    assert "no default" in signature_problem([_p("device", default="Ellipsis")], [_p("device")])


def test_imports_of_the_reference_modules_are_recognized() -> None:
    ref = describe("safetensors.torch", _reference_dir("0.8.0"))
    imported = sorted(n for n, e in ref["names"].items() if e.get("imported"))
    # What the reference's torch.py imports from elsewhere; its own names and safetensors' re-exports are kept.
    assert {"os", "sys", "torch", "defaultdict", "Any", "Dict", "List", "Optional", "Set", "Tuple", "Union"} == set(imported)
    kept = ref["names"]
    assert kept["safe_open"]["alias"] == "safetensors.safe_open" and not kept["safe_open"]["imported"]
    assert kept["_float8_e4m3fn"]["kind"] == "data" and kept["_SIZE"]["kind"] == "data"
