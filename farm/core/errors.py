"""One error root, one subclass per stage; every error names its subject and the next step.

The CLI turns a `FarmError` into one line and the exit code of its class
(documented in the README); `--debug` shows the traceback.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import ParamSpec

P = ParamSpec("P")


class FarmError(Exception):
    """Root of every error tunefarm raises on purpose."""

    exit_code = 1

    def __init__(self, message: str, *, subject: str | None = None, hint: str | None = None):
        self.message = message
        self.subject = subject
        self.hint = hint
        text = message if subject is None else f"{subject}: {message}"
        if hint:
            text = f"{text} ({hint})"
        super().__init__(text)


class UsageError(FarmError):
    """A flag or argument is wrong (bad budget, bad shape, --out not empty)."""

    exit_code = 2


class IngestError(FarmError):
    """The model file cannot be read or converted by torch."""

    exit_code = 3


class ExtractError(FarmError):
    """TVM cannot import the model, or it has no tunable operator."""

    exit_code = 4


class ServiceError(FarmError):
    """Redis, the broker, the tracker or the phones are unreachable or refuse."""

    exit_code = 5


class StoreUnavailable(ServiceError):
    """The store's backend failed an operation: Redis unreachable, timing out, a replica
    that refuses writes, restarting. Every backend raises it (the Redis one: redis-py's
    errors, translated where they leave the store); a caller that can wait retries it."""


class TuneError(FarmError):
    """Tuning a workload failed (every round failed, no phone of the key, job cancelled)."""

    exit_code = 6


class UnmeasuredError(TuneError):
    """No task the phones measured got one valid result: they cannot run the candidates."""

    exit_code = 9


class CompileError(FarmError):
    """Building the tuned model, or checking it against torch, failed."""

    exit_code = 7


class StoreError(FarmError):
    """A record or job in the store is missing or corrupt."""

    exit_code = 8


EXIT_INTERRUPTED = 130

EXIT_CODES: dict[str, int] = {
    "ok": 0,
    "error": FarmError.exit_code,
    "usage": UsageError.exit_code,
    "ingest": IngestError.exit_code,
    "extract": ExtractError.exit_code,
    "service": ServiceError.exit_code,
    "tune": TuneError.exit_code,
    "compile": CompileError.exit_code,
    "store": StoreError.exit_code,
    "unmeasured": UnmeasuredError.exit_code,
    "interrupted": EXIT_INTERRUPTED,
}


def best_effort(fn: Callable[P, object], *args: P.args, **kwargs: P.kwargs) -> None:
    """Progress writes never fail a round (Redis may be restarting)."""
    try:
        fn(*args, **kwargs)
    except Exception as e:  # noqa: BLE001
        logging.getLogger(__name__).warning("progress write %s failed (ignored): %s", getattr(fn, "__name__", fn), e)


def last_line(e: BaseException, limit: int = 200) -> str:
    """An error's message on one line: the last line of its text (TVM writes its traceback
    first and the message last), else its type's name."""
    text = str(e).strip().splitlines()
    return (text[-1] if text else type(e).__name__)[:limit]
