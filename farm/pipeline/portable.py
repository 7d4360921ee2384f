"""best/ for plain TVM: the module its records apply to, beside the records.

The best-config log's records match the farm's own module, not the one a user gets by importing
the model with TVM alone: batch norms folded into their convolutions (farm/pipeline/foldbn.py),
operators fused and decomposed for inference, blocks renamed by place
(farm/tir/blocknames.py). So best/ carries that module, saved with TVM's own serialization
(`tvm.ir.save_json`, weights included), and the target it was tuned for. Plain TVM applies
the log to it with MetaSchedule's database and Relax's apply-database pass (README, "Output");
`farm.prepare` makes the same module from the model file without a farm.
"""

from __future__ import annotations

import json
from pathlib import Path

from farm.core.aliases import IRModule, JsonDict

MODULE_FILE = "module.json"  # the fused Relax module, tvm.ir.save_json
TARGET_FILE = "target.json"  # the target the records were tuned for (TVM's JSON dict)


def save(best_dir: Path, fused: IRModule, target_json: JsonDict) -> None:
    """Write the module and target of a best-config log into its folder."""
    import tvm

    best_dir.mkdir(parents=True, exist_ok=True)
    (best_dir / MODULE_FILE).write_text(tvm.ir.save_json(fused))
    (best_dir / TARGET_FILE).write_text(json.dumps(target_json, indent=1, sort_keys=True))
