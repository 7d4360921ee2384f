"""Names for the values whose type mypy cannot know: the farm's only untyped annotations.

TVM ships no type information (no py.typed: mypy runs with ignore_missing_imports and
sees every TVM object as untyped), nor does Celery, redis-py's client is typed loosely,
and only farm/pipeline/ingest.py may import torch. A value of theirs that the farm passes
around is annotated with one of these names, so a reader knows what it is, and mypy
checks everything else. (A module that imports TVM's class anyway, such as MetaSchedule's
`Workload` or `RunnerResult` in workers/round, names that class instead: it is as untyped.)

The farm's own values have real types: dataclasses, the store's interfaces, Protocols. A
JSON object or array as it crosses a process boundary or is read from the store is a
`JsonDict` or a `JsonList`: its fields are checked where it is read (`from_json`).

This module is the bottom of the farm: it imports nothing of it, and nothing of TVM.
"""

from __future__ import annotations

from typing import Any

# TVM
IRModule = Any  # tvm.ir.IRModule: a model's Relax module, or one workload's TIR
PrimFunc = Any  # tvm.tirx.PrimFunc: one TIR function of a module
RelaxExpr = Any  # tvm.relax.Expr: a Var, Call or Constant of a Relax function
Target = Any  # tvm.target.Target
Schedule = Any  # tvm.s_tir.Schedule: a workload with schedule primitives applied
Trace = Any  # tvm.s_tir.Trace: the instructions and sampling decisions of a schedule
MeasureCandidate = Any  # tvm.s_tir.meta_schedule.MeasureCandidate: a schedule to measure
TuneContext = Any  # tvm.s_tir.meta_schedule.TuneContext: one workload's search
TVMDatabase = Any  # tvm.s_tir.meta_schedule.database.Database: records as TVM reads them
RuntimeModule = Any  # tvm.runtime.Module: a built kernel or model, on the host or a phone
RPCSession = Any  # tvm.rpc.RPCSession: a session on a phone
Device = Any  # tvm.runtime.Device: a device of this machine or of a phone's session
TVMTensor = Any  # tvm.runtime.Tensor: a tensor on a device
TVMObject = Any  # any other value of TVM's: an instruction, a sampling decision, a function

# torch (imported by farm/pipeline/ingest.py only: worker hosts do not have it)
TorchModule = Any  # torch.nn.Module
ExportedProgram = Any  # torch.export.ExportedProgram

# Celery and Redis
CeleryApp = Any  # celery.Celery: the farm's app (farm/jobs/dispatch.py)
CeleryTask = Any  # celery.Task, bound: its retry, update_state, send_event
RedisClient = Any  # redis.Redis (only farm/store talks to Redis)
RedisScript = Any  # redis.commands.core.Script: a Lua script registered on a client (None before)

# JSON
JsonDict = dict[str, Any]  # a JSON object as sent or stored (or settings as read: TOML, flags)
JsonList = list[Any]  # a JSON array as sent or stored: a tuning record, an argument's info
JsonValue = Any  # any JSON value as read (object, array, string, number, bool, null), unchecked
