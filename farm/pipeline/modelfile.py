"""What a torch.export zip (.pt2) would run when torch loads it, read without torch.

A .pt2 is meant to be data: the program as JSON, weights and constants as raw bytes. But
`torch.export.load` (torch 2.13) also unpickles, with `weights_only=False`:
- a weight or constant whose entry in the zip's payload config says `use_pickle`;
- a constant stored as a custom or opaque object (`custom_obj_*`, `opaque_obj_*`);
- the legacy single-file weights and constants (`data/weights/<model>.pt`);
and it loads AOTInductor packages (`data/aotinductor/`: compiled native code). Each is a way
for the file to run code as the user. `pickled_payloads` names every such entry, so that
`farm submit` refuses the file unless `--allow-pickle` is given, and `tensors_only` refuses
any unpickling torch attempts beyond tensors while it loads (the configs can lie).
Also here: which kind of torch file a model is (`sniff_format`), and what its format needs
(`check_model`): all read from the zip's entries, never unpickled.
"""

from __future__ import annotations

import contextlib
import functools
import json
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType

from farm.core.errors import IngestError, UsageError

_OBJECTS = ("custom_obj_", "opaque_obj_")  # constants torch unpickles as Python objects


def pickled_payloads(path: Path) -> list[str]:
    """The entries of the zip at `path` that loading it would unpickle or run (empty for
    a plain torch.export.save of tensors). Raises zipfile.BadZipFile / OSError / ValueError
    for a zip that cannot be read (the caller says so)."""
    found: list[str] = []
    for rel, read in _entries(path):
        if rel.startswith("data/aotinductor/"):
            found.append(f"{rel} (compiled AOTInductor code)")
        elif rel.startswith(("data/weights/", "data/constants/")) and rel.endswith(".pt"):
            found.append(f"{rel} (legacy pickled payload)")
        elif rel.startswith(("data/weights/", "data/constants/")) and rel.endswith(
                "_config.json"):
            found.extend(_pickled_in_config(read(), rel))
    return sorted(set(found))


def _entries(path: Path) -> Iterator[tuple[str, Callable[[], bytes]]]:
    """Each entry of the zip at `path`: its name within the zip's folder (as torch
    names it), and how to read it."""
    with zipfile.ZipFile(path) as zf:
        names = zf.namelist()
        root = zip_root(names)
        for name in names:
            yield name[len(root):], functools.partial(zf.read, name)


def zip_root(names: list[str]) -> str:
    """The zip's own top folder (`resnet/`, or `data/` for a file saved as data.pt2), as
    torch finds it: the folder of the zip's first entry, which every entry must be in
    (torch reads `<root>/<name>` and refuses a zip with an entry elsewhere). ValueError
    when there is none, an entry lies outside it, or two entries have one name (the zip
    reader here and torch's could read different ones)."""
    if not names or "/" not in names[0]:
        raise ValueError("its first entry is not in a folder (torch reads none like it)")
    root = names[0].split("/", 1)[0] + "/"
    outside = [n for n in names if not n.startswith(root)]
    if outside:
        raise ValueError(f"entry {outside[0]!r} lies outside the zip's folder {root!r}")
    if len(set(names)) != len(names):
        twice = sorted({n for n in names if names.count(n) > 1})
        raise ValueError(f"entry {twice[0]!r} is in the zip twice")
    return root


def code_payloads(path: Path) -> list[str]:
    """What a TorchScript file would run as torch loads it or that no graph shows: a class's
    `__setstate__` (TorchScript code run while the file loads, before any check), and
    objects of C++ classes (`torch.classes`: native methods). Read from the zip's
    entries, never loaded; raises as `pickled_payloads` does."""
    found: list[str] = []
    for rel, read in _entries(path):
        if not (rel.startswith("code/") or rel.endswith(".pkl")):
            continue
        data = read()
        if rel.startswith("code/") and b"__setstate__" in data:
            found.append(f"{rel} (__setstate__: code that runs as the file loads)")
        if b"torch.classes" in data:
            found.append(f"{rel} (objects of C++ classes)")
    return sorted(set(found))


def _pickled_in_config(raw: bytes, where: str) -> list[str]:
    """Entries of a payload config (fqn -> path_name, use_pickle, ...) torch unpickles."""
    try:
        config = json.loads(raw).get("config", {})
    except (ValueError, AttributeError) as e:
        raise ValueError(f"{where} is not a payload config: {e}") from e
    if not isinstance(config, dict):
        raise ValueError(f"{where} is not a payload config")
    kind = "weight" if "/weights/" in f"/{where}" else "constant"
    out = []
    for fqn, meta in config.items():
        if not isinstance(meta, dict):
            raise ValueError(f"{where}: entry {fqn!r} is not a table")
        path_name = str(meta.get("path_name", ""))
        if meta.get("use_pickle"):
            out.append(f"{kind} {fqn} (pickled)")
        elif path_name.startswith(_OBJECTS):
            out.append(f"{kind} {fqn} (a pickled Python object)")
    return out


def check_model(path: Path, shapes: list[tuple[int, ...]] | None, allow_pickle: bool) -> str:
    """What can be said of the model file without torch (it is never unpickled here):
    it is a torch file, and the flags its format needs are given. Returns the format."""
    fmt = sniff_format(path)
    if fmt != "torch.export" and shapes is None:
        raise UsageError(f"a {fmt} model needs --input-shape (e.g. --input-shape 1,3,224,224)",
                         subject=str(path))
    if fmt == "pickle" and not allow_pickle:
        raise UsageError(PICKLE_REFUSED, subject=str(path), hint=PICKLE_HINT)
    if fmt in ("torch.export", "torchscript") and not allow_pickle:
        refuse_code(path, fmt)
    return fmt


def listed(items: list[str], most: int = 5) -> str:
    """The first `most` of `items`, and how many more, for one line of an error."""
    more = f" and {len(items) - most} more" if len(items) > most else ""
    return ", ".join(items[:most]) + more


def refuse_code(path: Path, fmt: str) -> None:
    """UsageError when the torch.export or TorchScript file at `path` holds what torch would
    unpickle or run as code as it loads (`pickled_payloads`, `code_payloads`)."""
    try:
        payloads = pickled_payloads(path) if fmt == "torch.export" else code_payloads(path)
    except (zipfile.BadZipFile, OSError, ValueError) as e:
        raise IngestError(f"cannot read the zip: {e}", subject=str(path)) from e
    if payloads:
        raise UsageError(f"this {fmt} file holds what torch would unpickle or run as code: "
                         f"{listed(payloads)}", subject=str(path),
                         hint="pass --allow-pickle if you trust it, or export it again "
                              "with plain tensors")


PICKLE_REFUSED = "this is a pickled nn.Module; loading it runs code from the file"
PICKLE_HINT = "pass --allow-pickle if you trust it, or submit a torch.export .pt2"


def sniff_format(path: Path) -> str:
    """Which kind of torch file this is, from its zip entries (never unpickling it)."""
    if not path.exists():
        raise IngestError("no such file", subject=str(path))
    if path.is_dir():
        raise IngestError("is a directory, not a model file", subject=str(path))
    if path.stat().st_size == 0:
        raise IngestError("the file is empty", subject=str(path))
    try:
        with zipfile.ZipFile(path) as zf:
            names = zf.namelist()
            bad = zf.testzip()
    except zipfile.BadZipFile as e:
        raise IngestError(
            "not a model: not a torch file, whose files are zips (truncated, or not made by torch.export.save, "
            "torch.jit.save or torch.save)", subject=str(path)) from e
    except (OSError, EOFError, zipfile.LargeZipFile) as e:
        raise IngestError(f"cannot read the zip (truncated or corrupt?): {e}",
                          subject=str(path)) from e
    if bad is not None:
        raise IngestError(f"corrupt zip: entry {bad} fails its CRC check", subject=str(path))
    root = names[0].split("/", 1)[0] + "/" if names and "/" in names[0] else ""
    rel = {n[len(root):] for n in names if n.startswith(root)}  # as torch reads them
    if "archive_format" in rel or any(n.startswith("models/") for n in rel):
        return "torch.export"
    if any(n.startswith("code/") for n in rel) and "constants.pkl" in rel:
        return "torchscript"
    if "data.pkl" in rel:
        return "pickle"
    raise IngestError("not a model: a zip file, but not one torch wrote", subject=str(path))


@contextlib.contextmanager
def tensors_only(torch: ModuleType, path: Path) -> Iterator[None]:
    """While a .pt2 loads, torch unpickles tensors only: a call that asks for more (torch's
    own fallback for sample inputs that fail to load weights-only) is refused, and so is
    any plain unpickling (`pickle.loads`, torch's `_pickle_load_obj`: how torch.export.load
    reads opaque and custom objects), whatever the zip's configs said
    (farm/pipeline/modelfile.py read them; they can lie)."""
    import pickle

    refused = UsageError("this torch.export file holds a pickle that is not plain tensors; "
                         "loading it would run code the file carries", subject=str(path),
                         hint="pass --allow-pickle if you trust it")
    original = torch.load

    def load(*args: object, **kwargs: object) -> object:
        if kwargs.get("weights_only") is False:
            raise refused
        kwargs["weights_only"] = True
        return original(*args, **kwargs)

    def never(*_args: object, **_kwargs: object) -> object:
        raise refused

    held = [(torch, "load", load), (pickle, "loads", never),
            (torch._C, "_pickle_load_obj", never)]
    originals = [(owner, name, getattr(owner, name)) for owner, name, _ in held]
    # setattr: mypy reads a module's attributes through ModuleType, it does not let one be set
    for owner, name, value in held:
        setattr(owner, name, value)
    try:
        yield
    finally:
        for owner, name, value in originals:
            setattr(owner, name, value)
