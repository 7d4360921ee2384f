"""What a torch.export archive (.pt2) would run when torch loads it, read without torch.

A .pt2 is meant to be data: the program as JSON, weights and constants as raw bytes. But
`torch.export.load` (torch 2.13) also unpickles, with `weights_only=False`:
- a weight or constant whose entry in the archive's payload config says `use_pickle`;
- a constant stored as a custom or opaque object (`custom_obj_*`, `opaque_obj_*`);
- the legacy single-file weights and constants (`data/weights/<model>.pt`);
and it loads AOTInductor packages (`data/aotinductor/`: compiled native code). Each is a way
for the file to run code as the user. `pickled_payloads` names every such entry, so that
`farm submit` refuses the file unless `--allow-pickle` is given, and `tensors_only` refuses
any unpickling torch attempts beyond tensors while it loads (the configs can lie).
Also here: which kind of torch file a model is (`sniff_format`), and what its format needs
(`check_model`): all read from the archive's entries, never unpickled.
"""

from __future__ import annotations

import contextlib
import json
import zipfile
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

from farm.core.errors import IngestError, UsageError

_OBJECTS = ("custom_obj_", "opaque_obj_")  # constants torch unpickles as Python objects


def pickled_payloads(path: Path) -> list[str]:
    """The entries of the archive at `path` that loading it would unpickle or run (empty for
    a plain torch.export.save of tensors). Raises zipfile.BadZipFile / OSError / ValueError
    for an archive that cannot be read (the caller says so)."""
    found: list[str] = []
    with zipfile.ZipFile(path) as zf:
        names = zf.namelist()
        for name in names:
            rel = _relative(name)
            if rel.startswith("data/aotinductor/"):
                found.append(f"{rel} (compiled AOTInductor code)")
            elif rel.startswith(("data/weights/", "data/constants/")) and rel.endswith(".pt"):
                found.append(f"{rel} (legacy pickled payload)")
            elif rel.startswith(("data/weights/", "data/constants/")) and rel.endswith(
                    "_config.json"):
                found.extend(_pickled_in_config(zf.read(name), rel))
    return sorted(set(found))


def _relative(name: str) -> str:
    """An archive entry without the archive's own top folder (`resnet/data/...`)."""
    parts = name.split("/", 1)
    return parts[1] if len(parts) == 2 and not name.startswith(("data/", "models/")) else name


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
    if fmt == "torch.export" and not allow_pickle:
        try:
            payloads = pickled_payloads(path)
        except (zipfile.BadZipFile, OSError, ValueError) as e:
            raise IngestError(f"cannot read the archive: {e}", subject=str(path)) from e
        if payloads:
            shown = ", ".join(payloads[:5]) + (f" and {len(payloads) - 5} more"
                                               if len(payloads) > 5 else "")
            raise UsageError(f"this torch.export file holds what torch would unpickle or run "
                             f"as code: {shown}", subject=str(path),
                             hint="pass --allow-pickle if you trust it, or export it again "
                                  "with plain tensors")
    return fmt


PICKLE_REFUSED = "this is a pickled nn.Module; loading it runs code from the file"
PICKLE_HINT = "pass --allow-pickle if you trust it, or submit a torch.export .pt2"


def sniff_format(path: Path) -> str:
    """Which kind of torch file this is, from its archive entries (never unpickling it)."""
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
            "not a model: not a torch archive (truncated or not made by torch.export.save, "
            "torch.jit.save or torch.save)", subject=str(path)) from e
    except (OSError, EOFError, zipfile.LargeZipFile) as e:
        raise IngestError(f"cannot read the archive (truncated or corrupt?): {e}",
                          subject=str(path)) from e
    if bad is not None:
        raise IngestError(f"corrupt archive: entry {bad} fails its CRC check", subject=str(path))
    if any(n.endswith("archive_format") for n in names) or any("/models/" in n for n in names):
        return "torch.export"
    if any("/code/" in n for n in names) and any(n.endswith("constants.pkl") for n in names):
        return "torchscript"
    if any(n.endswith("data.pkl") for n in names):
        return "pickle"
    raise IngestError("not a model: a zip file, but not one torch wrote", subject=str(path))


@contextlib.contextmanager
def tensors_only(torch: ModuleType, path: Path) -> Iterator[None]:
    """While a .pt2 loads, torch unpickles tensors only: a call that asks for more (torch's
    own fallback for sample inputs that fail to load weights-only) is refused, whatever the
    archive's configs said (farm/pipeline/archive.py read them; they can lie)."""
    original = torch.load

    def load(*args: object, **kwargs: object) -> object:
        if kwargs.get("weights_only") is False:
            raise UsageError("this torch.export file holds a pickle that is not plain "
                             "tensors; loading it would run code the file carries",
                             subject=str(path), hint="pass --allow-pickle if you trust it")
        kwargs["weights_only"] = True
        return original(*args, **kwargs)

    # setattr: mypy reads a module's attributes through ModuleType, it does not let one be set
    setattr(torch, "load", load)  # noqa: B010
    try:
        yield
    finally:
        setattr(torch, "load", original)  # noqa: B010
