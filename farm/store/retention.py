"""The archive's retention (`archive_retention_days`): days older than it are deleted, but
never a whole record the store still refers to, a workload's best or a job's final pick:
its line is carried into the day of the prune first, and stays while it is referred to."""

from __future__ import annotations

from farm.store.cold import Archive, is_copy
from farm.store.store import Entry, JobRecords


def referenced(store: JobRecords) -> dict[tuple[str, str], Entry]:
    """The entries of the records the store refers to, by (workload key, candidate): each
    workload's best and each job's final picks. Raises StoreError when a job's final choice
    cannot be read (then nothing may be pruned)."""
    wanted = set(store.best_candidates(store.workload_keys()).items())
    for job_id in store.job_ids():
        wanted.update((store.final_picks(job_id) or {}).items())
    entries = {(wk, cand): store.entry(wk, cand) for wk, cand in sorted(wanted)}
    return {key: e for key, e in entries.items() if e is not None}


def prune(store: JobRecords, archive: Archive, keep_days: float,
          now: float | None = None) -> list[str]:
    """Delete the archive's days older than `keep_days` (0: keep everything), keeping the
    records the store refers to (`referenced`); returns the folders deleted."""
    if keep_days <= 0:
        return []
    keep = referenced(store)
    return archive.prune(keep_days, now, keep=lambda path, n, line: is_copy(keep, path, n, line))
