"""The client's modules talk to each other through public names (STYLE: no `_private` import
across modules), and `farm.prepare` reads a model as `farm submit` does, by the same
defaults."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import farm
from farm.client import api

CLIENT = Path(api.__file__).resolve().parent


def test_no_client_module_imports_a_private_name_of_another():
    found = []
    for path in sorted(CLIENT.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("farm"):
                found += [f"{path.name}:{node.lineno}: {node.module}.{a.name}"
                          for a in node.names if a.name.startswith("_")]
    assert found == []


def test_prepare_reads_the_inputs_as_submit_does():
    from farm.pipeline.options import DEFAULT_DTYPE, SubmitOptions

    def default(fn, name):
        return inspect.signature(fn).parameters[name].default

    assert default(farm.prepare, "dtype") == default(farm.Farm.submit, "dtype") == \
        SubmitOptions.__dataclass_fields__["dtype"].default == DEFAULT_DTYPE
