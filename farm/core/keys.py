"""Every Redis key tunefarm uses, built in one place, under one prefix.

Records never expire; job state is kept for `JOB_TTL_S` after the job ends.
"""

from __future__ import annotations

PREFIX = "tunefarm"
JOB_TTL_S = 30 * 24 * 3600


def key_for(*parts: str) -> str:
    return ":".join((PREFIX, *parts))


def celery_prefix() -> str:
    """Prepended by kombu and Celery to every key of theirs (queues, unacked rounds, results,
    bindings, event channels): the broker may share its database with the store, and every
    key the farm writes, its own or Celery's, starts with `tunefarm:`."""
    return key_for("celery") + ":"


# --- the record store (the farm's memory; never expires) -------------------
def workload(wk: str) -> str:
    """Hash: the workload's TIR (TVM JSON), target, device key, name, first job."""
    return key_for("wl", wk)


def records(wk: str) -> str:
    """Hash: candidate hash -> its entry (run time or failure class, verified, TVM version,
    time: farm/store/packing.py), for every candidate ever measured: deduplication."""
    return key_for("wl", wk, "records")


def best(wk: str) -> str:
    """Hash: the best valid record so far (fields cand, us, record)."""
    return key_for("wl", wk, "best")


def hot(wk: str) -> str:
    """Hash: candidate hash -> whole record, packed (farm/store/packing.py), for the K fastest
    valid candidates of the workload (failures leave first); the others are in the archive."""
    return key_for("wl", wk, "hot")


def commit_attempt(attempt: str) -> str:
    """String, expiring after `COMMIT_TTL_S`: what the commit of this attempt id answered, so
    that a commit sent again by the client's retry (its reply lost to a dropped connection
    or a failover) is answered as the first time, never counted twice."""
    return key_for("commit", attempt)


COMMIT_TTL_S = 120


def spool() -> str:
    """List: "<workload key>\\n<packed record>", whole records on their way to the archive
    (farm/store/cold.py drains it)."""
    return key_for("spool")


def spool_dead() -> str:
    """List: spool items the drain could not read, kept as they were (never trimmed)."""
    return key_for("spool", "dead")


def device_lost(wk: str) -> str:
    """Hash: candidate hash -> phones lost while measuring it (culprit detection)."""
    return key_for("wl", wk, "lost")


def unverified(wk: str) -> str:
    """Set: candidates whose stored record is imported and not yet measured by a phone of the
    farm (never the best; the first rounds of the workload measure the best of them)."""
    return key_for("wl", wk, "unverified")


def features(wk: str) -> str:
    """Hash: candidate hash -> its cost-model features (cached; workers/metaschedule/costmodel.py)."""
    return key_for("wl", wk, "features")


def model_workloads(mkey: str) -> str:
    """Set: the workload keys of a model key (device key + target; farm/store/learned.py)."""
    return key_for("model", mkey, "workloads")


def model_families(mkey: str) -> str:
    """Hash: workload key -> its operator family (farm/tir/family.py), for a model key."""
    return key_for("model", mkey, "families")


def cost_model(mkey: str) -> str:
    """Hash: a model key's cost model (booster, samples, workloads, trained_at, versions)."""
    return key_for("model", mkey)


def model_training(mkey: str) -> str:
    """String with a TTL: a round is training the model key's cost model."""
    return key_for("model", mkey, "training")


def workload_index() -> str:
    """Sorted set: every workload key, scored by first-seen time."""
    return key_for("workloads")


# --- jobs ------------------------------------------------------------------
def job(job_id: str) -> str:
    """String: the JobSpec JSON."""
    return key_for("job", job_id)


def job_status(job_id: str) -> str:
    """Hash: state, message, finalized_by, times."""
    return key_for("job", job_id, "status")


def job_tasks(job_id: str) -> str:
    """Hash: workload key -> task state JSON (state, rounds, host, best_us, failures...)."""
    return key_for("job", job_id, "tasks")


def job_measured(job_id: str) -> str:
    """Hash: workload key -> records this job measured (incremented by the keep-best script)."""
    return key_for("job", job_id, "measured")


def job_final(job_id: str) -> str:
    """String: the job's final choice, workload key -> candidate hash (set once: finalize)."""
    return key_for("job", job_id, "final")


def job_allocated(job_id: str) -> str:
    """Integer: trials of the job's budget already given to rounds."""
    return key_for("job", job_id, "allocated")


def job_counts(job_id: str) -> str:
    """Hash: "<workload key>|<counter>" -> count of phone measurements of this job, counted
    by the keep-best script as they are committed (measurements, new, duplicates) and by
    the worker (device_lost). `duplicates` is a candidate measured although it was stored."""
    return key_for("job", job_id, "counts")


def active_jobs() -> str:
    """Set: ids of the jobs the supervisor looks after (running, not yet finalized)."""
    return key_for("jobs", "active")


# --- rounds (a round's logical id: job, workload, index and run; not the attempt) -----
def round_lease(logical_id: str) -> str:
    """String: the copy of the round running now ("round id|node|host|pid"); expires unless
    renewed, so a dead holder frees it within one host TTL."""
    return key_for("round", logical_id, "lease")


def round_done(logical_id: str) -> str:
    """String: set once when the round has run to its end (a later copy does not run)."""
    return key_for("round", logical_id, "done")


def round_starts(logical_id: str) -> str:
    """Hash: starts and ends of the round's copies; starts that never ended killed their process."""
    return key_for("round", logical_id, "starts")


def round_sent(logical_id: str) -> str:
    """String: set once when the round has been sent by the round before it or the planner
    (no double dispatch; the supervisor's copies are other attempts of the same round)."""
    return key_for("round", logical_id, "sent")


def supervisor() -> str:
    """String: the worker host whose supervisor leads now (expires unless renewed)."""
    return key_for("supervisor")


def jobs_index() -> str:
    """Sorted set: job ids by creation time."""
    return key_for("jobs")


def job_names() -> str:
    """Hash: a job's name (`farm submit --name`) -> the job it was last given to."""
    return key_for("job-names")


# --- worker hosts ------------------------------------------------------------
def host(name: str) -> str:
    """String: the host's heartbeat JSON (tracker, keys, phone counts); expires after the config's host_ttl_s."""
    return key_for("host", name)


def host_pattern() -> str:
    return key_for("host", "*")


def handoff(device_key: str, host_name: str) -> str:
    """String: a round handed the rest of its trials to this idle host (workers/round/handoff.py);
    expires once the host's heartbeats can show it busy."""
    return key_for("handoff", device_key, host_name)


# --- phones (a phone: its device key and the address it registered at its tracker) ----
def phone(device_key: str, addr: str) -> str:
    """Hash: one phone's totals (busy_s, work_s, measurements, device_lost, worker, last_at);
    never expires: a phone's day and its history."""
    return key_for("phone", device_key, addr)


def phone_losses(device_key: str, addr: str) -> str:
    """Sorted set: the times a phone was lost (device lost), within the config's window."""
    return key_for("phone", device_key, addr, "lost")


def phone_index() -> str:
    """Set: "<device key>|<address>" of every phone the farm has seen."""
    return key_for("phones")


def job_phone_spans(job_id: str) -> str:
    """List: the job's measurements as phone spans (JSON: phone, task, start, end, outcome)."""
    return key_for("job", job_id, "phones")


def lease(wk: str) -> str:
    """String: the job tuning this workload now (expires, so a dead holder cannot block)."""
    return key_for("wl", wk, "lease")


# --- a round's search lent to a helper host (farm/store/sessions.py) -------
def search_session(sid: str, part: str) -> str:
    """A search session's part: "owner" and "helper" (their beats, expiring), "closed" (why
    it ended), "batches" and "results" (lists: built batches to the phone host, their
    measurements back)."""
    return key_for("search", sid, part)


def search_open() -> str:
    """The open search sessions (a sorted set: id -> until when its owner's beat lasts)."""
    return key_for("search-open")
