"""TVM's private parts the farm relies on (farm/devices/tvmapi.py) are where and as the farm
expects them in the installed TVM: an upgrade that moves one fails here, with the line that
says which, before any job does."""

from __future__ import annotations

import re
import types
from pathlib import Path

from farm.devices import tvmapi

ROOT = Path(__file__).resolve().parents[2]


def test_the_pinned_tvm_has_what_the_farm_uses_of_its_internals():
    assert tvmapi.problems() == []


def test_a_change_in_tvm_is_named(monkeypatch):
    """The check can fail: a TVM whose `_worker_func` lost a parameter and whose server lost
    `_serving` is reported, one line each."""
    from tvm.rpc import server
    from tvm.s_tir.meta_schedule.builder import local_builder

    monkeypatch.setattr(local_builder, "_worker_func", lambda mod, target: None)
    monkeypatch.delattr(server, "_serving")
    found = tvmapi.problems()
    assert len(found) == 2, found
    assert "_worker_func now takes ('mod', 'target')" in found[0]
    assert "tvm.rpc.server._serving is gone" in found[1]


def test_the_runtime_only_flag_is_read_from_tvm():
    import sys

    import tvm

    assert tvmapi.compiler_loaded() is (not tvm.base._RUNTIME_ONLY)
    fake = types.SimpleNamespace(base=types.SimpleNamespace(_RUNTIME_ONLY=True))
    saved = sys.modules["tvm"]
    try:
        sys.modules["tvm"] = fake  # type: ignore[assignment]
        assert tvmapi.compiler_loaded() is False
    finally:
        sys.modules["tvm"] = saved


# what reaching into TVM's private parts looks like in the farm's code
PRIVATE = re.compile(r"from tvm[\w.]* import [^#\n]*\b_[a-zA-Z]\w*|\btvm(?:\.\w+)*\._[a-zA-Z]\w*"
                     r"|\._cls\b|\._train\(|\b_ffi_api\b|\b_RUNTIME_ONLY\b|\b_LOADED_LIBS\b")


def private_uses(root: Path) -> list[str]:
    """Lines of the farm's code (farm/, workers/) under `root` that use a private TVM name
    outside farm/devices/tvmapi.py."""
    found = []
    for path in sorted([*(root / "farm").rglob("*.py"), *(root / "workers").rglob("*.py")]):
        if path.name == "tvmapi.py" and path.parent.name == "devices":
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#", 1)[0]
            if PRIVATE.search(code) and not code.lstrip().startswith(('"', "'")):
                found.append(f"{path.relative_to(root)}:{n}: {line.strip()}")
    return found


def test_no_private_tvm_name_outside_tvmapi(tmp_path):
    """Every private TVM name the farm uses is reached through tvmapi.py, which checks it
    against the installed TVM; a use elsewhere would break on an upgrade unannounced."""
    assert private_uses(ROOT) == []
    bad = tmp_path / "workers" / "round"
    bad.mkdir(parents=True)
    (tmp_path / "farm").mkdir()
    (bad / "runner.py").write_text("from tvm.s_tir.dlight.base.transform import _apply_rules\n"
                                   "class R(RPCRunner._cls):\n    pass\n"
                                   "x = tvm.base._RUNTIME_ONLY\nmodel._train(xs=1, ys=2)\n"
                                   "ok = 1  # RPCRunner._cls in a comment is fine\n")
    assert len(private_uses(tmp_path)) == 4
