"""Operator families (farm/tir/family.py): by the anchor block's structure, not by shape or name;
and the store's index of them per model key (both backends)."""

from __future__ import annotations

import pytest

from farm.core.messages import TuneTask
from farm.store.learned import model_key


def conv(ci: int, co: int, k: int, stride: int = 1, depthwise: bool = False, size: int = 14):
    import tvm
    from tvm import te, topi

    data = te.placeholder((1, ci, size, size), name="data")
    if depthwise:
        weight = te.placeholder((ci, 1, k, k), name="w")
        out = topi.nn.depthwise_conv2d_nchw(data, weight, stride, k // 2, 1)
    else:
        weight = te.placeholder((co, ci, k, k), name="w")
        out = topi.nn.conv2d_nchw(data, weight, stride, k // 2, 1)
    relu = te.compute(out.shape, lambda *i: te.max(out(*i), 0.0), name="relu")
    return tvm.IRModule({"main": te.create_prim_func([data, weight, relu])})


def test_a_family_is_the_anchor_blocks_structure_whatever_the_shape_or_epilogue():
    from farm.tir.family import family
    from tests.integration.test_costmodel import matmul

    dense = family(matmul(64, 32, 16))
    assert dense == family(matmul(128, 96, 48, bias_relu=True))  # other shape, an epilogue
    convs = {family(conv(16, 32, 3)), family(conv(64, 24, 1, stride=2)),
             family(conv(8, 8, 5, size=28))}
    assert len(convs) == 1  # 3x3, 1x1 strided, 5x5: one family
    depthwise = family(conv(32, 32, 3, depthwise=True))
    assert depthwise == family(conv(96, 96, 5, stride=2, depthwise=True))
    assert len({dense, convs.pop(), depthwise}) == 3


def test_an_elementwise_workload_is_a_family_of_its_own():
    import tvm
    from tvm import te

    from farm.tir.family import family
    from tests.integration.test_costmodel import matmul

    a = te.placeholder((4, 8), name="a")
    relu = te.compute((4, 8), lambda i, j: te.max(a[i, j], 0.0), name="relu")
    mapped = family(tvm.IRModule({"main": te.create_prim_func([a, relu])}))
    assert mapped.startswith("map:") and mapped != family(matmul(4, 8, 8))


def test_the_store_indexes_families_per_model_key_and_forgets_a_removed_workload(store):
    target = {"kind": "llvm"}

    def task(wk: str, fam: str, key: str = "k") -> TuneTask:
        return TuneTask(name=wk, workload_key=wk, weight=1, mod_json="{}", target=target,
                        device_key=key, family=fam)

    store.put_workload(task("w1", "dense"))
    store.put_workload(task("w2", ""))  # stored before families were kept
    store.put_workload(task("w3", "conv", key="other"))
    assert store.model_families(model_key("k", target)) == {"w1": "dense"}
    assert store.put_workload(task("w2", "conv")) is False  # stored already: indexed now
    assert store.model_families(model_key("k", target)) == {"w1": "dense", "w2": "conv"}
    assert store.remove_workload("w1")
    assert store.model_families(model_key("k", target)) == {"w2": "conv"}
    assert store.model_families(model_key("other", target)) == {"w3": "conv"}


def test_a_round_classifies_workloads_stored_before_families_were_kept():
    import tvm

    from farm.store import open_store
    from farm.tir.family import family
    from tests.integration.test_costmodel import matmul
    from workers.metaschedule.transfer import families_of

    store = open_store("memory://")
    target = {"kind": "llvm"}
    mod = matmul(32, 32, 32)
    store.put_workload(TuneTask(name="old", workload_key="old", weight=1,
                                mod_json=tvm.ir.save_json(mod), target=target, device_key="k"))
    mkey = model_key("k", target)
    assert store.model_families(mkey) == {}
    assert families_of(store, mkey) == {"old": family(mod)}
    assert store.model_families(mkey) == {"old": family(mod)}  # kept: classified once


@pytest.mark.parametrize("name", ["fused_conv2d3_add2", "fused_matmul_add"])
def test_the_name_says_nothing(name):
    """Two tasks of one name pattern but different structure are different families (the
    name's digits-dropped pattern was the family before)."""
    import tvm

    from farm.tir.family import family
    from tests.integration.test_costmodel import matmul
    from workers.metaschedule.transfer import task_family

    a = TuneTask(name=name, workload_key="a", weight=1, target={"kind": "llvm"}, device_key="k",
                 mod_json=tvm.ir.save_json(conv(8, 8, 3, depthwise=True)))
    b = TuneTask(name=name, workload_key="b", weight=1, target={"kind": "llvm"}, device_key="k",
                 mod_json=tvm.ir.save_json(matmul(8, 8, 8)))
    assert task_family(a) != task_family(b)
    assert task_family(a) == family(conv(16, 16, 3, depthwise=True))
