"""`farm.prepare`: the module a job's best/ applies to, made from the model without a farm.

    import farm, tvm
    mod = farm.prepare("model.pt2")              # or farm.prepare(net, (torch.randn(1, 3, 224, 224),))
    tvm.ir.assert_structural_equal(mod, tvm.ir.load_json(open("out/best/module.json").read()))

The model is read as `farm submit` reads it (in a child process with no secret of the farm;
a pickled module only with `allow_pickle`), then imported, its batch norms folded, fused and
its blocks named for the device key's target (farm/pipeline/portable.py): the same stages, so
the same module as the job's when the target is the same (a host_cpu profile such as
cpu-local is tuned for this machine's CPU on the embedded farm; on a lab farm, for the CPU its
phone hosts report).
"""

# Imports inside functions: `farm.prepare` loads the pipeline only when called (`import
# farm` stays light).

from __future__ import annotations

import tempfile
from pathlib import Path

from farm.core.aliases import IRModule, TorchModule
from farm.pipeline.options import DEFAULT_DTYPE


def prepare(model: str | Path | TorchModule, example_inputs: tuple[object, ...] | None = None,
            *, device_key: str | None = None, input_shape: str | None = None,
            dtype: str = DEFAULT_DTYPE, allow_pickle: bool = False, broker: str | None = None,
            config_file: str | Path | None = None) -> IRModule:
    """The fused Relax module a job on `model` tunes and whose records its best/ holds."""
    from farm.client.api import Farm, model_file, quiet
    from farm.pipeline.job import Submission
    from farm.pipeline.job import prepare as prepare_stages
    from farm.pipeline.options import SubmitOptions

    settings: dict[str, object] = {} if device_key is None else {"device_key": device_key}
    lab = Farm(broker=broker, config_file=config_file, settings=settings)
    with tempfile.TemporaryDirectory(prefix="farm-prepare-") as tmp:
        out = Path(tmp) / "prepare"
        with model_file(model, example_inputs, out) as path:
            opts = SubmitOptions(model=Path(path), out=out, input_shape=input_shape, dtype=dtype,
                                 allow_pickle=allow_pickle)
            return prepare_stages(Submission(opts, lab.config, say=quiet)).extracted.fused
