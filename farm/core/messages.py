"""Everything that crosses a process boundary: frozen dataclasses with to_json/from_json.

Each carries a schema version; `from_json` refuses a version it does not know
(with the subject named), so an old worker never misreads a new message.
Celery messages are JSON dicts of these, never pickle.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from typing import TypeVar

from farm.core.aliases import JsonDict
from farm.core.errors import StoreError

SCHEMA = 1
# --priority -> the broker's priority. kombu's Redis transport serves its priority steps
# (0, 3, 6, 9) in order, 0 first; jobs of one priority share the phones round by round.
PRIORITIES = {"high": 0, "normal": 3, "low": 6}
T = TypeVar("T", bound="_Message")


class _Message:
    kind = "message"

    def to_json(self) -> JsonDict:
        data = asdict(self)  # type: ignore[call-overload]
        data["schema"] = SCHEMA
        return data

    def dumps(self) -> str:
        return json.dumps(self.to_json(), sort_keys=True)

    @classmethod
    def from_json(cls: type[T], data: JsonDict) -> T:
        if not isinstance(data, dict):
            raise StoreError(f"expected a JSON object, got {type(data).__name__}", subject=cls.kind)
        schema = data.get("schema")
        if schema != SCHEMA:
            raise StoreError(f"unknown schema version {schema!r} (this farm reads {SCHEMA})",
                             subject=cls.kind, hint="upgrade tunefarm on this host")
        names = {f.name for f in fields(cls)}  # type: ignore[arg-type]
        try:
            return cls(**{k: v for k, v in data.items() if k in names})
        except TypeError as e:
            raise StoreError(f"malformed: {e}", subject=cls.kind) from e

    @classmethod
    def loads(cls: type[T], text: str | bytes) -> T:
        try:
            data = json.loads(text)
        except (ValueError, UnicodeDecodeError) as e:
            raise StoreError(f"not JSON: {e}", subject=cls.kind) from e
        return cls.from_json(data)


@dataclass(frozen=True)
class TuneTask(_Message):
    """One tuning task: one fused TIR workload of a model, for one device key."""

    kind = "tune task"
    name: str
    workload_key: str
    weight: int
    mod_json: str  # the dispatched TIR IRModule as TVM JSON (tvm.ir.save_json)
    target: JsonDict
    device_key: str
    flop: float = 0.0
    space_size: int = 0  # design spaces MetaSchedule generated; 0: not counted
    family: str = ""  # its anchor block's structure (farm/tir/family.py); "": not known


@dataclass(frozen=True)
class RoundRequest(_Message):
    """One Celery message: one round of `trials` trials for one workload of one job."""

    kind = "round request"
    job_id: str
    workload_key: str
    task_name: str
    round_index: int
    trials: int  # trials this round measures
    target_trials: int  # the job's goal for this workload (the round stops early when met)
    max_rounds: int
    device_key: str
    model: str = ""
    attempt: int = 0  # > 0: re-sent by the supervisor after the round was lost
    run: int = 0  # the job's run (0, then +1 per `farm resume`); rounds of an older run are stale
    priority: int = 3  # the broker's priority (Redis: 0 is served first); see PRIORITIES

    @property
    def logical_id(self) -> str:
        """The round itself, whatever copy: job, workload, index and run (not the attempt).
        Fencing is per logical round: one copy runs at a time, and none after it is done."""
        base = f"{self.job_id}:{self.workload_key}:{self.round_index}"
        return f"{base}:run{self.run}" if self.run else base

    @property
    def round_id(self) -> str:
        """This copy of the round (the Celery task id): the logical id and the attempt."""
        return f"{self.logical_id}:r{self.attempt}" if self.attempt else self.logical_id

    def again(self) -> RoundRequest:
        """The same round, as a new copy (a new task id, so the broker does not drop it)."""
        return RoundRequest.from_json({**self.to_json(), "attempt": self.attempt + 1})


def logical_of(round_id: str) -> str:
    """The logical round of a task id (`RoundRequest.round_id`)."""
    head, _, tail = round_id.rpartition(":r")
    return head if head and tail.isdigit() else round_id


@dataclass(frozen=True)
class RoundResult(_Message):
    """What a round reports back (also written to the job's task state in the store)."""

    kind = "round result"
    job_id: str
    workload_key: str
    round_index: int
    host: str
    measured: int  # new records this round committed (valid + failed kernels)
    valid: int
    requested: int = 0  # trials the round asked MetaSchedule for
    duplicates: int = 0  # candidates measured twice: the store had them (as the store counts)
    skipped_stored: int = 0  # candidates the search proposed that the store had: not measured
    failures: dict[str, int] = field(default_factory=dict)  # class -> count
    errors: dict[str, str] = field(default_factory=dict)  # class -> its first message, brief
    device_lost: int = 0
    best_us: float | None = None
    wall_s: float = 0.0
    measure_s: float = 0.0  # of wall_s: batches on the phones (sent -> results back)
    skipped: bool = False  # a redelivered round that had already run
    ranked_by: str = ""  # what ranked its candidates first (own records, the key's model)
    single_schedule: bool = False  # the workload has exactly one possible schedule
    handed_off: bool = False  # ended early: the rest of its trials went to an idle host
    searched_by: str = ""  # a helper host searched and built its batches (workers/round/lend/phone_side.py)
    seeded: int = 0  # of `measured`: its relatives' schedules, carried over (workers/metaschedule/transfer.py)
    # CPU seconds per part on this host (workers/round/account.py) and on the helper host
    # that searched it, when one did
    cpu: dict[str, float] = field(default_factory=dict)
    helper_cpu: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class JobSpec(_Message):
    """A job as the store keeps it: what to tune and how far."""

    kind = "job"
    job_id: str
    model: str
    device_key: str
    target: JsonDict
    trials_per_task: int
    round_trials: int
    workload_keys: list[str]
    task_names: dict[str, str]  # workload key -> task name
    weights: dict[str, int]
    created_at: float = 0.0
    max_rounds: int = 0
    trials_budget: int = 0  # > 0: a job budget the planner spends where it pays most
    early_stop_rounds: int = 0  # > 0: a task stops after this many rounds without improvement
    priority: str = "normal"  # a key of PRIORITIES
    run: int = 0  # 0 for the first run, +1 per `farm resume`
    options: JsonDict = field(default_factory=dict)  # how it was submitted (for resume)
