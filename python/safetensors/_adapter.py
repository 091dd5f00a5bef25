"""What every framework module exports, made from its adapter: ``save``, ``save_file``, ``load``, ``load_file``.

The modules differ only in what they declare: the adapter (how tensors are built, which devices it takes), how a
dict of its tensors is flattened for the writer, its tensor type, the spelling of the first parameter
(``tensor_dict`` in numpy, ``tensors`` elsewhere) and which functions take a ``device``. Parameter names are
part of the reference's API (callers pass them by keyword), so each function is compiled from a short template,
the way ``dataclasses`` builds ``__init__``: a real signature, Python's own argument errors, no forwarding of
``*args``.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, FrozenSet, NamedTuple, Optional

from ._core import Flattened, Framework, load_file_as, open_bytes, PathLike, serialize_flat, serialize_flat_file

__all__ = ["SaveLoad", "from_numpy_in_place", "non_contiguous_message", "save_load_functions"]


def non_contiguous_message(name: str) -> str:
    """The reference's ValueError text for saving a tensor that is not contiguous."""
    return (
        f"You are trying to save a non contiguous tensor: `{name}` which is not allowed. It either means you are "
        "trying to save tensors which are reference of each other in which case it's recommended to save only the "
        "full tensors, and reslice at load time, or simply call `.contiguous()` on your tensor to pack it before "
        "saving."
    )


class SaveLoad(NamedTuple):
    save: Callable[..., bytes]
    save_file: Callable[..., None]
    load: Callable[..., Dict[str, Any]]
    load_file: Callable[..., Dict[str, Any]]


# {t}: the tensors parameter; {d}: ", device='cpu'" where the function takes a device; {dv}: the device passed on.
_TEMPLATES = {
    "save": "def save({t}, metadata=None):\n"
            "    return serialize_flat(flatten({t}), metadata)\n",
    "save_file": "def save_file({t}, filename, metadata=None, *, fsync=False):\n"
                 "    serialize_flat_file(flatten({t}), filename, metadata, fsync)\n",
    "load": "def load(data{d}):\n"
            "    return adapter.load_copies(open_bytes(data), {dv})\n",
    "load_file": "def load_file(filename{d}, *, backend='mmap'):\n"
                 "    return load_file_as(framework, filename, {dv}, backend)\n",
}

_DOCS = {
    "save": "The bytes of a safetensors file holding ``{t}`` (a dict of {what} by name).",
    "save_file": "Writes ``{t}`` (a dict of {what} by name) to ``filename`` atomically: a temporary file in the same "
                 "directory, renamed over it, each tensor streamed from its own memory. ``fsync=True`` also makes "
                 "the new file durable before returning.",
    "load": "Every tensor of the file in ``data``{on}, in memory of its own.",
    "load_file": "Every tensor of ``filename``{on}, in file order. ``backend``: ``\"mmap\"`` maps the file (CPU "
                 "tensors are copy-on-write views of the mapping where the framework can wrap memory), "
                 "``\"pread\"`` (positional reads into memory of their own, through the page cache), "
                 "``\"direct\"`` (the same past the page cache, O_DIRECT) or ``\"auto\"`` (per file: direct "
                 "for a large file the page cache does not hold, else pread).",
}


def save_load_functions(
    module: str,
    framework: str,
    adapter: Framework,
    flatten: Callable[[Dict[str, Any]], Flattened],
    tensor_type: Any,
    type_name: str,
    *,
    tensors: str = "tensors",
    with_device: FrozenSet[str] = frozenset(),
) -> SaveLoad:
    """The four functions of ``module`` (its ``__name__``).

    Args:
        framework: the name ``safe_open`` takes (``"np"``, ``"flax"``, ...), for ``load_file``.
        adapter: the module's ``Framework``; ``load`` reads through its ``load_copies``.
        flatten: checks a dict of tensors for saving and describes it (``(specs, keep_alive)``, see
            ``serialize_flat``); its errors are the save errors.
        tensor_type: the framework's tensor type, for the annotations; ``type_name`` spells it for the docs.
        tensors: the name of ``save``'s and ``save_file``'s first parameter.
        with_device: the functions (``"load"``, ``"load_file"``) that take ``device="cpu"`` after their first
            parameter.
    """
    namespace: Dict[str, Any] = {
        "adapter": adapter,
        "flatten": flatten,
        "framework": framework,
        "load_file_as": load_file_as,
        "open_bytes": open_bytes,
        "serialize_flat": serialize_flat,
        "serialize_flat_file": serialize_flat_file,
    }
    what = f"``{type_name}``"
    tensor_dict = Dict[str, tensor_type]
    annotations = {
        "save": {tensors: tensor_dict, "metadata": Optional[Dict[str, str]], "return": bytes},
        "save_file": {tensors: tensor_dict, "filename": PathLike, "metadata": Optional[Dict[str, str]],
                      "fsync": bool, "return": None},
        "load": {"data": bytes, "return": tensor_dict},
        "load_file": {"filename": PathLike, "backend": str, "return": tensor_dict},
    }
    functions = {}
    for name, template in _TEMPLATES.items():
        device = name in with_device
        code = template.format(t=tensors, d=", device='cpu'" if device else "", dv="device" if device else "'cpu'")
        exec(compile(code, f"<{module}.{name}>", "exec"), namespace)
        function = namespace.pop(name)
        function.__module__ = module
        function.__qualname__ = name
        function.__doc__ = _DOCS[name].format(t=tensors, what=what, on=" on ``device``" if device else "")
        function.__annotations__ = dict(annotations[name], **({"device": Any} if device else {}))
        functions[name] = function
    return SaveLoad(**functions)


def from_numpy_in_place(module: str, name: str, adapter: Framework) -> Callable[[Dict[str, Any]], Dict[str, Any]]:
    """The reference's ``_np2<framework>(numpy_dict)`` helper of ``module``: replaces each array of the dict by
    the adapter's tensor of it, in place, and returns the dict."""

    def convert(numpy_dict: Dict[str, Any]) -> Dict[str, Any]:
        for key, value in numpy_dict.items():
            numpy_dict[key] = adapter.to_device(value, "cpu")
        return numpy_dict

    convert.__module__, convert.__name__, convert.__qualname__ = module, name, name
    convert.__doc__ = (f"Replaces each array of ``numpy_dict`` by its {adapter.name} tensor, in place (as the "
                       "reference does); returns the dict.")
    return convert
