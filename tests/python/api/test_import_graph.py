"""The package reads top-down (STYLE.md 20): its modules import downward only -- no import circle, not even
through an import inside a function -- and a name that starts with ``_`` stays inside its module: no module
imports another module's underscore name or reaches for it through a module it imported.

Checked on the source (python/safetensors) with ``ast``, so nothing is imported to check it."""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Dict, List, Set, Tuple

PACKAGE_DIR = Path(__file__).resolve().parents[3] / "python" / "safetensors"

#: Names the reference's modules export with a leading underscore: public by compatibility (COMPAT.md: other
#: projects import them), so importing one from the module that holds it in the reference is allowed.
REFERENCE_NAMES = {
    "safetensors": {"_safe_open_handle"},
    "safetensors.torch": {
        "_SIZE", "_TYPES", "_end_ptr", "_evaluate_tensors_for_save", "_filter_shared_not_shared",
        "_find_shared_tensors", "_flatten_as_ptr", "_float4_e2m1_x2", "_float8_e4m3fn", "_float8_e4m3fnuz",
        "_float8_e5m2", "_float8_e5m2fnuz", "_float8_e8m0", "_getdtype", "_is_complete", "_remove_duplicate_names",
        "_to_ndarray", "_tobytes", "_view2torch",
    },
    "safetensors.numpy": {"_TYPES", "_flatten", "_getdtype", "_is_little_endian", "_view2np"},
    "safetensors.flax": {"_jnp2np", "_np2jnp"},
    "safetensors.tensorflow": {"_np2tf", "_tf2np"},
    "safetensors.mlx": {"_mx2np", "_np2mx"},
    "safetensors.paddle": {"_SIZE", "_TYPES", "_flatten", "_getdtype", "_np2paddle", "_paddle2np", "_to_ndarray",
                           "_view2paddle"},
}
NATIVE = "safetensors._safetensors_cpp"


def package_modules(root: Path) -> Dict[str, Path]:
    """Every Python module of the package under ``root`` by dotted name (packages by their ``__init__``)."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _private(name: str, owner: str) -> bool:
    """Whether ``owner.name`` is a name that stays inside ``owner``."""
    dunder = name.startswith("__") and name.endswith("__")
    return name.startswith("_") and not dunder and name not in REFERENCE_NAMES.get(owner, ())


def _resolve(module: str, is_package: bool, level: int, target: str) -> str:
    """The absolute name ``from <level dots><target>`` means inside ``module``."""
    if level == 0:
        return target
    base = module.split(".")
    if not is_package:
        base = base[:-1]
    base = base[: len(base) - (level - 1)]
    return ".".join(base + ([target] if target else []))


def imports(module: str, path: Path, known: Set[str]) -> Tuple[Set[str], List[str]]:
    """The package modules ``module`` imports anywhere in its source (function bodies included), and its
    imports of another module's underscore names."""
    tree = ast.parse(path.read_text(), str(path))
    is_package = path.name == "__init__.py"
    edges: Set[str] = set()
    bad: List[str] = []
    aliases: Dict[str, str] = {}  # local name -> package module it is bound to
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in known:
                    edges.add(alias.name)
                    if alias.asname:
                        aliases[alias.asname] = alias.name
        elif isinstance(node, ast.ImportFrom):
            source = _resolve(module, is_package, node.level, node.module or "")
            if source.split(".")[0] != "safetensors":
                continue
            for alias in node.names:
                submodule = f"{source}.{alias.name}"
                if submodule in known or submodule == NATIVE:
                    if submodule in known:
                        edges.add(submodule)
                    aliases[alias.asname or alias.name] = submodule
                    continue
                if source in known:  # a name defined by the module `source` (not one of its submodules)
                    edges.add(source)
                if _private(alias.name, source) and source != module:
                    bad.append(f"{module} imports {alias.name} from {source} (line {node.lineno})")
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases
                and _private(node.attr, aliases[node.value.id]) and aliases[node.value.id] != module):
            bad.append(f"{module} uses {aliases[node.value.id]}.{node.attr} (line {node.lineno})")
    return edges - {module}, bad


def circles(graph: Dict[str, Set[str]]) -> List[List[str]]:
    """The import circles of ``graph``: its strongly connected components of more than one module (Tarjan)."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on_stack: Set[str] = set()
    out: List[List[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def problems(root: Path) -> List[str]:
    """Every import circle and every cross-module underscore import of the package under ``root``."""
    modules = package_modules(root)
    known = set(modules)
    graph: Dict[str, Set[str]] = {}
    found: List[str] = []
    for name, path in modules.items():
        graph[name], bad = imports(name, path, known)
        found += bad
    found += ["import circle: " + " <-> ".join(c) for c in circles(graph)]
    return found


def test_the_package_imports_downward_only_and_keeps_underscore_names_private():
    found = problems(PACKAGE_DIR)
    assert not found, "\n".join(found)


def test_the_checker_sees_circles_lazy_imports_and_private_names(tmp_path):
    pkg = tmp_path / "safetensors"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("from .a import f\n")
    (pkg / "a.py").write_text("def f():\n    from .b import g\n    return g()\n")
    (pkg / "b.py").write_text("from . import a\nfrom .c import _hidden\n\ndef g():\n    return a._secret\n")
    (pkg / "c.py").write_text("_hidden = 1\n")
    found = problems(pkg)
    assert "import circle: safetensors.a <-> safetensors.b" in found
    assert any("imports _hidden from safetensors.c" in p for p in found)
    assert any("uses safetensors.a._secret" in p for p in found)


def readme_layers() -> List[List[str]]:
    """The rows of README's package map (section "The Python package"), top to bottom: the modules each row names
    (``_core.py`` -> ``safetensors._core``, ``distributed/`` -> ``safetensors.distributed``, its submodules too)."""
    text = (PACKAGE_DIR.parents[1] / "README.md").read_text(encoding="utf-8")
    section = text.split("### The Python package", 1)[1]
    rows = []
    for line in section.splitlines():
        if line.startswith("| `"):
            names = re.findall(r"`([^`]+)`", line.split("|")[1])
            rows.append(["safetensors" if n == "__init__.py" else "safetensors." + n.replace(".py", "").rstrip("/")
                         for n in names if "/" not in n.rstrip("/")])
        elif rows:
            break
    return rows


def test_the_readme_map_lists_every_module_below_what_it_imports():
    # README: "Modules import downward only, in the order of this table (each imports only modules above it)."
    modules = package_modules(PACKAGE_DIR)
    known = set(modules)
    row_of = {}
    for i, names in enumerate(readme_layers()):
        for name in names:
            row_of[name] = i

    def row(module: str) -> int:
        while module not in row_of and "." in module:
            module = module.rsplit(".", 1)[0]
        return row_of.get(module, -1)

    unmapped = sorted(m for m in modules if row(m) < 0 and m != "safetensors._safetensors_cpp")
    assert unmapped == [], "README's package map does not name these modules: " + ", ".join(unmapped)
    upward = []
    for name, path in modules.items():
        edges, _ = imports(name, path, known)
        upward += [f"{name} (row {row(name)}) imports {e} (row {row(e)})" for e in sorted(edges) if row(e) > row(name)]
    assert upward == [], "reorder README's package map or the imports:\n" + "\n".join(upward)


def test_the_base_imports_no_other_module_of_the_package():
    edges, _ = imports("safetensors._core", PACKAGE_DIR / "_core.py", set(package_modules(PACKAGE_DIR)))
    assert edges == set()


# The size rule: a source file holds one concept, and no file in src/, python/ or bench/ runs past 500 lines. The
# stubs of the native module (nanobind.stubgen writes them) follow the same rule: a part of the binding that would
# make one too long goes in a submodule of its own, as the engine and sharded checkpoints do.
MAX_LINES = 500


def test_no_source_file_in_src_python_or_bench_is_over_500_lines():
    root = PACKAGE_DIR.parents[1]
    long = []
    for top in ("src", "python", "bench"):
        for path in sorted((root / top).rglob("*")):
            if path.suffix not in (".cc", ".h", ".c", ".py", ".pyi") or not path.is_file():
                continue
            relative = path.relative_to(root).as_posix()
            lines = path.read_text(encoding="utf-8").count("\n")
            if lines > MAX_LINES:
                long.append(f"{relative}: {lines} lines")
    assert long == [], "split these along their seams:\n" + "\n".join(long)
