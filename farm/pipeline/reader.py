"""The model is read in a process of its own that holds no secret of the farm.

A model file is untrusted input: a TorchScript file runs its TorchScript, a pickle (with
`--allow-pickle`) runs any code, and torch's loaders have had bugs. `load_apart` runs
ingest (farm/pipeline/ingest.py) in a child Python whose environment has none of the farm's
secrets (broker and Redis URLs, passwords, Flower's credentials, nor the files naming them),
and takes its result back as data only: the Relax module as TVM JSON, the inputs and
torch's outputs as .npy files read without pickle, the rest as JSON. What the child could
forge is a wrong model, never code in this process.

    python -m farm.pipeline.reader FOLDER   (its request on stdin as JSON)
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterable
from pathlib import Path

from farm.core import errors
from farm.core.aliases import JsonDict
from farm.core.confine import confined
from farm.core.errors import FarmError, IngestError
from farm.core.secrets import SECRET_VARS
from farm.devices.lean import SHADOW
from farm.pipeline import ingest
from farm.pipeline.ingest import ModelBundle


def child_env() -> dict[str, str]:
    """This process's environment without the farm's secrets (and the files naming them),
    and with torch importable (farm/devices/lean.py may hide it from this process's children)."""

    drop = set(SECRET_VARS) | {f"{v}_FILE" for v in SECRET_VARS}
    env = {k: v for k, v in os.environ.items() if k not in drop}
    path = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != SHADOW]
    env["PYTHONPATH"] = os.pathsep.join(path)
    return env


def load_apart(path: Path, shapes: list[tuple[int, ...]] | None, dtype: str,
               allow_pickle: bool, threads: int, hide: Iterable[Path] = ()) -> ModelBundle:
    """`ingest.load` of the model at `path`, run in a child process with no farm secret: its
    environment has none, and where the machine allows (farm/core/confine.py) it sees no
    other process, no network, and neither `hide` (the farm's home) nor the secret files.
    The child reads a copy of the model in its own folder (the model's own may be hidden)."""
    import numpy as np
    import tvm

    with tempfile.TemporaryDirectory(prefix="farm-reader-") as tmp:
        folder = Path(tmp)
        copy = folder / "model" / path.name
        copy.parent.mkdir()
        try:
            shutil.copyfile(path, copy)
        except OSError as e:
            raise IngestError(f"cannot read it: {e.strerror or e}", subject=str(path)) from e
        request = {"path": str(copy), "shapes": shapes, "dtype": dtype,
                   "allow_pickle": allow_pickle, "threads": threads}
        argv = confined([sys.executable, "-m", "farm.pipeline.reader", str(folder)], hide,
                        keep=[folder])
        proc = subprocess.run(argv, input=json.dumps(request), capture_output=True, text=True,
                              env=child_env())
        if (folder / "error.json").is_file():
            raise _error(json.loads((folder / "error.json").read_text()), str(copy), str(path))
        if proc.returncode != 0 or not (folder / "meta.json").is_file():
            tail = (proc.stderr or "").strip().splitlines()[-1:] or ["no message"]
            raise IngestError(f"the model reader ended with code {proc.returncode}: {tail[0]}",
                              subject=str(path), hint="`farm --debug submit` shows more")
        meta = json.loads((folder / "meta.json").read_text())

        def arrays(kind: str) -> list[np.ndarray]:
            return [np.load(folder / f"{kind}{i}.npy", allow_pickle=False)
                    for i in range(meta[kind])]

        return ModelBundle(name=path.stem, path=str(path), fmt=meta["fmt"],
                           mod=tvm.ir.load_json((folder / "mod.json").read_text()),
                           inputs=arrays("inputs"), outputs=arrays("outputs"),
                           torch_us=float(meta["torch_us"]), torch_threads=int(meta["threads"]))


def _error(data: JsonDict, copy: str, path: str) -> FarmError:
    """The child's FarmError, as the same class in this process (naming the model's own
    path where the child named its copy)."""
    cls = getattr(errors, str(data.get("kind")), None)
    if not (isinstance(cls, type) and issubclass(cls, FarmError)):
        cls = IngestError

    def named(text: object) -> str | None:
        return None if text is None else str(text).replace(copy, path)

    return cls(named(data.get("message", "")) or "", subject=named(data.get("subject")),
               hint=named(data.get("hint")))


def main(folder: str) -> int:
    """The child: read the request, ingest the model, write the result as data."""
    import numpy as np
    import tvm

    out = Path(folder)
    req = json.loads(sys.stdin.read())
    try:
        shapes = [tuple(s) for s in req["shapes"]] if req["shapes"] is not None else None
        bundle = ingest.load(req["path"], shapes, req["dtype"], req["allow_pickle"],
                             threads=req["threads"])
    except FarmError as e:
        (out / "error.json").write_text(json.dumps({
            "kind": type(e).__name__, "message": e.message, "subject": e.subject,
            "hint": e.hint}))
        return 1
    (out / "mod.json").write_text(tvm.ir.save_json(bundle.mod))
    for kind in ("inputs", "outputs"):
        for i, a in enumerate(getattr(bundle, kind)):
            np.save(out / f"{kind}{i}.npy", np.ascontiguousarray(a), allow_pickle=False)
    (out / "meta.json").write_text(json.dumps({
        "name": bundle.name, "path": bundle.path, "fmt": bundle.fmt,
        "torch_us": bundle.torch_us, "threads": bundle.torch_threads,
        "inputs": len(bundle.inputs), "outputs": len(bundle.outputs)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1]))
