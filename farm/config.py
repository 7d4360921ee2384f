"""One frozen config object. Precedence: flag > FARM_* environment > farm.toml > default."""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import tomllib

from farm.errors import UsageError


def default_home() -> Path:
    """Where the embedded farm keeps its store: $XDG_DATA_HOME/tunefarm or ~/.local/share/tunefarm."""
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(Path.home(), ".local", "share")
    return Path(base) / "tunefarm"


@dataclass(frozen=True)
class FarmConfig:
    """Every setting of a farm process. Units are in the names."""

    broker_url: str | None = None  # None: the embedded default starts its own Redis
    redis_url: str | None = None  # the record store; default: the broker
    home: Path = field(default_factory=default_home)
    device_key: str = "cpu-local"
    phones: int = 2  # emulated phones of the embedded default
    phone_delay_s: float = 0.0  # added by each emulated phone to every measurement (benchmarks)
    round_trials: int = 32  # trials in one Celery message (one round)
    build_timeout_s: float = 60.0
    run_timeout_s: float = 30.0  # one measurement session on a phone; a frozen phone ends here
    device_wait_s: float = 300.0  # how long a round waits for a phone of its key
    # the broker's visibility timeout: a last resort only. A lost round comes back through the
    # supervisor (workers/supervisor.py) within a host TTL, whatever this is.
    round_timeout_s: float = 1800.0
    supervisor_interval_s: float = 5.0  # how often the leading supervisor sweeps the jobs
    redis_maxmemory: str = "4gb"  # the embedded and `farm up` Redis; full: clear error, no eviction
    # rounds a worker runs at once; 0: automatic (`farm worker`): 2 when its phones are
    # devices of their own (one round searches and builds while the other's batch is on the
    # phones), 1 when they are emulated on this host (measurements must not share its cores)
    worker_concurrency: int = 0
    # build processes; a round builds, then measures, so builds may use every core
    builder_workers: int = field(default_factory=lambda: max(1, os.cpu_count() or 1))
    builder_max_uses: int = 64  # a warm build process is recycled after this many builds
    # threads of a round's search and cost model; 0: the host's cores / worker_concurrency
    # (a round searches, builds, then measures, so its search may use every core it has)
    search_cores: int = 0
    profiles: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def search_threads(self) -> int:
        if self.search_cores > 0:
            return self.search_cores
        return max(1, (os.cpu_count() or 1) // max(1, self.worker_concurrency))

    @property
    def store_url(self) -> str | None:
        return self.redis_url or self.broker_url

    def validate(self) -> FarmConfig:
        for name in ("phones", "round_trials", "builder_workers", "builder_max_uses"):
            if getattr(self, name) < 1:
                raise UsageError(f"{name} must be >= 1, got {getattr(self, name)}",
                                 subject="config")
        if self.worker_concurrency < 0:
            raise UsageError(f"worker_concurrency must be >= 0 (0: automatic), got "
                             f"{self.worker_concurrency}", subject="config")
        if self.search_cores < 0:
            raise UsageError(f"search_cores must be >= 0 (0: automatic), got "
                             f"{self.search_cores}", subject="config")
        if self.phone_delay_s < 0:
            raise UsageError(f"phone_delay_s must be >= 0, got {self.phone_delay_s}",
                             subject="config")
        for name in ("build_timeout_s", "run_timeout_s", "device_wait_s", "round_timeout_s",
                     "supervisor_interval_s"):
            if getattr(self, name) <= 0:
                raise UsageError(f"{name} must be > 0, got {getattr(self, name)}",
                                 subject="config")
        return self


_ENV = {
    "broker_url": "FARM_BROKER_URL",
    "redis_url": "FARM_REDIS_URL",
    "home": "FARM_HOME",
    "device_key": "FARM_DEVICE_KEY",
    "phones": "FARM_PHONES",
    "phone_delay_s": "FARM_PHONE_DELAY_S",
    "round_trials": "FARM_ROUND_TRIALS",
    "build_timeout_s": "FARM_BUILD_TIMEOUT_S",
    "run_timeout_s": "FARM_RUN_TIMEOUT_S",
    "device_wait_s": "FARM_DEVICE_WAIT_S",
    "round_timeout_s": "FARM_ROUND_TIMEOUT_S",
    "supervisor_interval_s": "FARM_SUPERVISOR_INTERVAL_S",
    "redis_maxmemory": "FARM_REDIS_MAXMEMORY",
    "worker_concurrency": "FARM_WORKER_CONCURRENCY",
    "builder_workers": "FARM_BUILDER_WORKERS",
    "builder_max_uses": "FARM_BUILDER_MAX_USES",
    "search_cores": "FARM_SEARCH_CORES",
}


def _coerce(name: str, value: Any) -> Any:
    kinds = {f.name: f.type for f in fields(FarmConfig)}
    kind = str(kinds[name])
    try:
        if name == "home":
            return Path(os.path.expanduser(str(value)))
        if "int" in kind and "float" not in kind:
            return int(value)
        if "float" in kind:
            return float(value)
    except ValueError as e:
        raise UsageError(f"{name} = {value!r} is not a number", subject="config") from e
    return value if value != "" else None


def load_config(
    flags: dict[str, Any] | None = None,
    env: dict[str, str] | None = None,
    config_file: str | os.PathLike | None = None,
) -> FarmConfig:
    """Build the config: flags (None means unset) > FARM_* env > farm.toml > defaults.

    The file is `config_file`, else $FARM_CONFIG, else ./farm.toml when it exists.
    """
    env = dict(os.environ) if env is None else env
    values: dict[str, Any] = {}
    path = config_file or env.get("FARM_CONFIG") or ("farm.toml" if Path("farm.toml").exists() else None)
    if path:
        try:
            data = tomllib.loads(Path(path).read_text())
        except (OSError, tomllib.TOMLDecodeError) as e:
            raise UsageError(f"cannot read config file: {e}", subject=str(path)) from e
        farm = data.get("farm", {})
        unknown = set(farm) - {f.name for f in fields(FarmConfig)}
        if unknown:
            raise UsageError(f"unknown settings {sorted(unknown)}", subject=str(path))
        values.update({k: _coerce(k, v) for k, v in farm.items() if k != "profiles"})
        values["profiles"] = data.get("profiles", {})
    for name, var in _ENV.items():
        if env.get(var, "") != "":
            values[name] = _coerce(name, env[var])
    for name, value in (flags or {}).items():
        if value is not None:
            values[name] = _coerce(name, value)
    return FarmConfig(**values).validate()
