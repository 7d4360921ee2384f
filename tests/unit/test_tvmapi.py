"""TVM's private parts the farm relies on (farm/devices/tvmapi.py) are where and as the farm
expects them in the installed TVM: an upgrade that moves one fails here, with the line that
says which, before any job does."""

from __future__ import annotations

import types

from farm.devices import tvmapi


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
