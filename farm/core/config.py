"""One frozen config object. Precedence: flag > FARM_* environment > farm.toml > default."""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path
from urllib.parse import quote, urlsplit

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the same parser, as the tomli package
    import tomli as tomllib  # type: ignore[no-redef]

from farm.core.aliases import JsonDict
from farm.core.cores import usable_cores
from farm.core.errors import UsageError
from farm.core.profiles import check_overrides
from farm.core.secrets import SECRET_VARS, secret
from farm.core.urls import is_sentinel, parse_sentinel


def default_home() -> Path:
    """Where the embedded farm keeps its store: $XDG_DATA_HOME/tunefarm or ~/.local/share/tunefarm."""
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(Path.home(), ".local", "share")
    return Path(base) / "tunefarm"


_AT_LEAST_0 = ("phone_delay_s", "phone_heat_after_s", "phone_aside_s", "archive_retention_days")
_ABOVE_0 = ("build_timeout_s", "run_timeout_s", "device_wait_s", "round_timeout_s",  # seconds
            "supervisor_interval_s", "phone_lost_window_s", "lent_batch_timeout_s")


@dataclass(frozen=True)
class FarmConfig:
    """Every setting of a farm process. Units are in the names."""

    broker_url: str | None = None  # None: the embedded default starts its own Redis
    redis_url: str | None = None  # the record store; default: the broker
    home: Path = field(default_factory=default_home)
    device_key: str = "cpu-local"
    phones: int = 2  # emulated phones of the embedded default
    phone_delay_s: float = 0.0  # added by each emulated phone to every measurement (benchmarks)
    # the embedded farm's first phone heats (~8x slower) this long after its first session (tests)
    phone_heat_after_s: float = 0.0
    phone_work_group: int = 0  # an emulated OpenCL phone's largest work-group; 0: pocl's own
    round_trials: int = 32  # trials in one Celery message (one round)
    build_timeout_s: float = 60.0
    run_timeout_s: float = 30.0  # one measurement session on a phone; a frozen phone ends here
    device_wait_s: float = 300.0  # how long a round waits for a phone of its key
    phone_lost_limit: int = 3  # lost this many times within the window: set aside this long
    phone_lost_window_s: float = 600.0
    phone_aside_s: float = 300.0
    # the broker's visibility timeout: a last resort only. A lost round comes back through the
    # supervisor (farm/jobs/supervisor.py) within a host TTL, whatever this is.
    round_timeout_s: float = 1800.0
    supervisor_interval_s: float = 5.0  # how often the leading supervisor sweeps the jobs
    # a host whose heartbeat is older than this has left the farm, and a running round's
    # lease expires this long after its process died
    host_ttl_s: int = 30
    redis_maxmemory: str = "4gb"  # the embedded and `farm up` Redis; full: clear error, no eviction
    # rounds a worker runs at once; 0: automatic (`farm worker`): 2 when its phones are
    # devices of their own (one round searches and builds while the other's batch is on the
    # phones), 1 when they are emulated on this host (measurements must not share its cores)
    worker_concurrency: int = 0
    # build processes; a round builds, then measures, so builds may use every core
    builder_workers: int = field(default_factory=usable_cores)
    builder_max_uses: int = 1024  # calls a helper process serves, then recycled (bench/cpu.md)
    search_cores: int = 0  # threads of a round's search and cost model; 0: cores / concurrency
    # schedules the evolutionary search evolves a batch: 8 per candidate of a batch of 16, as
    # MetaSchedule's 512 for batches of 64 (bench/ahead.md)
    search_population: int = 128
    search_iters: int = 2  # its genetic iterations per batch (MetaSchedule: 4; bench/cpu.md)
    # a round the key's model ranks (a new workload with relatives) picks its first batch from
    # this many random schedules, ranked (workers/metaschedule/firstbatch.py); 0: evolved
    first_sample: int = 64
    # ... and picks each later batch from this many times the batch, which the evolutionary
    # search proposes evolving blind (random scores, no features: workers/metaschedule/
    # search.py); 0: the model scores the search's population every genetic iteration
    search_pool: int = 4
    # 1: at a job's end, a round hands the rest of its trials to a host of its key that has
    # none (workers/round/handoff.py); 0: a round always ends where it started
    round_handoff: int = 1
    # 1: a round searches and builds its next batch while the phones measure the last one
    # (workers/round/loop.py); 0: one after the other, as MetaSchedule's tune_tir does
    search_ahead: int = 1
    # a round lends its search and builds to a helper host (workers/round/lend/phone_side.py): "auto" when
    # this host is short of cores for its phones, "always" whenever a helper is alive, "never"
    lend_search: str = "auto"
    # a lent round takes its search back when its helper sends no batch within this long
    lent_batch_timeout_s: float = 180.0
    # a workload the store has never measured measures first up to this many of its relatives'
    # best schedules (its operator family's), replayed on it (workers/metaschedule/transfer.py); 0: never
    transfer_seeds: int = 8
    metrics_port: int = 0  # a worker's Prometheus /metrics (0: not served); loopback unless told
    metrics_host: str = "127.0.0.1"
    arm64_root: Path | None = None  # the emulated arm64 phone's folder (default: home/arm64-sim)
    opencl_root: Path | None = None  # TVM's OpenCL runtime for phones (default: home/opencl)
    # whole records a workload keeps in Redis (its fastest); every other one is in the
    # archive, a folder or fsspec URL (default: home/archive), kept this many days (0: always)
    hot_records: int = 32
    archive: str = ""
    archive_retention_days: float = 0.0
    profiles: dict[str, JsonDict] = field(default_factory=dict)
    config_file: Path | None = None  # the farm.toml read (a child process reads it too)

    @property
    def search_threads(self) -> int:
        if self.search_cores > 0:
            return self.search_cores
        return max(1, usable_cores() // max(1, self.worker_concurrency))

    @property
    def arm64_dir(self) -> Path:
        """Where the emulated arm64 phone is made, once (farm/devices/arm64sim.py)."""
        return self.arm64_root if self.arm64_root is not None else self.home / "arm64-sim"

    @property
    def opencl_dir(self) -> Path:
        """Where TVM's OpenCL runtime for phones is built, once (farm/devices/opencl.py)."""
        return self.opencl_root if self.opencl_root is not None else self.home / "opencl"

    @property
    def archive_url(self) -> str:
        """Where whole records that left Redis are kept (farm/store/cold.py)."""
        return self.archive or str(self.home / "archive")

    @property
    def store_url(self) -> str | None:
        return self.redis_url or self.broker_url

    def validate(self, sources: dict[str, str] | None = None) -> FarmConfig:
        """Refuse a setting out of range, naming where it came from (`sources`: setting ->
        the flag, FARM_* variable or farm.toml that set it; else "config")."""
        def bad(name: str, what: str) -> UsageError:
            where = (sources or {}).get(name, "config")
            return UsageError(f"{name} {what}, got {getattr(self, name)!r}", subject=where,
                              hint=_fix(where, name))

        for name in ("phones", "round_trials", "builder_workers", "builder_max_uses",
                     "host_ttl_s", "search_population", "search_iters", "phone_lost_limit",
                     "hot_records"):
            if getattr(self, name) < 1:
                raise bad(name, "must be >= 1")
        if self.hot_records > 4096:  # the commit script reads the K entries in one call
            raise bad("hot_records", "must be at most 4096")
        for name, zero in (("worker_concurrency", "automatic"), ("search_cores", "automatic"),
                           ("transfer_seeds", "never"), ("phone_work_group", "pocl's own"),
                           ("first_sample", "evolved"), ("search_pool", "ranked evolution")):
            if getattr(self, name) < 0:
                raise bad(name, f"must be >= 0 (0: {zero})")
        if not 0 <= self.metrics_port < 65536:
            raise bad("metrics_port", "must be a port from 1 to 65535 (0: no metrics)")
        for name, what in (("round_handoff", "1 (hand off) or 0 (never)"),
                           ("search_ahead", "1 (search while measuring) or 0 (one after another)")):
            if getattr(self, name) not in (0, 1):
                raise bad(name, f"must be {what}")
        if self.lend_search not in ("auto", "always", "never"):
            raise bad("lend_search", "must be auto, always or never")
        self._check_seconds(bad)
        return self._check_urls_and_home(sources, bad)

    def _check_seconds(self, bad: Callable[[str, str], UsageError]) -> None:
        for name, value in ((n, getattr(self, n)) for n in (*_AT_LEAST_0, *_ABOVE_0)):
            if not math.isfinite(value):
                raise bad(name, "must be a finite number of seconds")
            if value < 0 or (value == 0 and name in _ABOVE_0):
                raise bad(name, "must be > 0" if name in _ABOVE_0 else "must be >= 0")

    def _check_urls_and_home(self, sources: dict[str, str] | None,
                             bad: Callable[[str, str], UsageError]) -> FarmConfig:
        for name in ("broker_url", "redis_url"):
            url = getattr(self, name)
            if url is not None and (why := url_problem(url)):
                where = (sources or {}).get(name, "config")
                raise UsageError(f"{name} {redact(url)!r} is not a Redis URL: {why}",
                                 subject=where,
                                 hint="e.g. redis://HOST:6379/0 or redis://:PASSWORD@HOST:6379/0"
                                      + ("; unset it to use the embedded farm"
                                         if where == "FARM_BROKER_URL" else ""))
        if not self.device_key:
            raise bad("device_key", "must be a device key such as cpu-local")
        if not isinstance(self.redis_maxmemory, str) or not re.fullmatch(
                r"\d+\s*([kmg]b?|b)?", self.redis_maxmemory.strip(), re.IGNORECASE):
            raise bad("redis_maxmemory", "must be a Redis memory size such as 4gb or 512mb")
        if self.home.exists() and not self.home.is_dir():
            raise UsageError("FARM_HOME (the embedded farm's folder) is a file, not a folder",
                             subject=str(self.home), hint=_fix((sources or {}).get(
                                 "home", "config"), "home"))
        if not self.home.exists() and not _can_make(self.home):
            raise UsageError("FARM_HOME (the embedded farm's folder) cannot be made there",
                             subject=str(self.home), hint=_fix((sources or {}).get(
                                 "home", "config"), "home"))
        return self


def _can_make(path: Path) -> bool:
    """Can this user make `path`: its nearest existing parent is a folder it may write in
    (and not in /proc or /sys, which refuse new entries whatever the bits say)."""
    parent = path
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    resolved = parent.resolve()
    if resolved.parts[1:2] in (("proc",), ("sys",)):
        return False
    return resolved.is_dir() and os.access(resolved, os.W_OK | os.X_OK)


def _fix(where: str, name: str) -> str:
    if where.startswith("FARM_"):
        return f"fix or unset {where}"
    if where.startswith("--"):
        return f"fix {where}"
    if where != "config":
        return f"fix {name} in that file"
    return f"see the README's Configuration section for {name}"


def redact(url: str) -> str:
    """A URL without its user and password, for messages and logs, whatever characters the
    password holds ("/", "@", ":"): everything between "://" and the last "@" goes."""
    scheme, sep, rest = url.partition("://")
    if not sep or "@" not in rest:
        return url
    return f"{scheme}://***@{rest.rpartition('@')[2]}"


def with_password(scheme_host: str, password: str) -> str:
    """`redis://:PASSWORD@HOST...` from `redis://HOST...`, the password URL-encoded (a "/",
    "@" or "#" in it would otherwise end the URL's user part early)."""
    scheme, _, rest = scheme_host.partition("://")
    return f"{scheme}://:{quote(password, safe='')}@{rest}" if password else scheme_host


def url_problem(url: str) -> str | None:
    """Why `url` is no Redis URL redis-py and Celery can use, or None when it is one."""
    if is_sentinel(url):
        try:
            parse_sentinel(url)
        except ValueError as e:
            return str(e)
        return None
    parts = urlsplit(url)
    if parts.scheme not in ("redis", "rediss", "unix"):
        return ("the scheme must be redis://, rediss://, unix:// or sentinel://"
                + (f", not {parts.scheme}://" if "://" in url else " (it has none)"))
    if parts.scheme == "unix":
        return None if parts.path else "a unix:// URL needs the socket's path"
    if not parts.hostname:
        return "it names no host"
    try:
        parts.port  # noqa: B018 - raises on a port that is no number in range
    except ValueError:
        return "its port is not a number from 1 to 65535"
    db = parts.path.strip("/")
    if db and not db.isdigit():
        return f"the database after the host must be a number, not {db!r}"
    return None


# every setting's environment variable: FARM_ and its name in capitals (FARM_CONFIG names the
# farm.toml, `config_file`; `profiles` are its [profiles.*] tables, set there only)
_ENV = {f.name: f"FARM_{f.name.upper()}" for f in fields(FarmConfig)
        if f.name not in ("profiles", "config_file")}


_KINDS = {"int": int, "float": float}
_FLAGS = {"broker_url": "--broker", "redis_url": "--redis", "worker_concurrency": "--concurrency",
          "lend_search": "--lend-search"}
# names of before, still understood: farm.toml's [farm] keys and FARM_* variables
_OLD = {"borrow_search": "lend_search", "FARM_BORROW_SEARCH": "FARM_LEND_SEARCH"}


def _kind(name: str) -> str:
    """"int", "float", "path" or "str": what setting `name` holds."""
    kind = str({f.name: f.type for f in fields(FarmConfig)}[name])
    if name in ("home", "arm64_root", "opencl_root"):
        return "path"
    if "int" in kind and "float" not in kind:
        return "int"
    return "float" if "float" in kind else "str"


def _coerce(name: str, value: object, where: str = "config", typed: bool = False) -> object:
    """`value` of setting `name` as its type, or a UsageError naming `where` it came from.
    Text (an environment variable, a flag) is parsed; a `typed` value (farm.toml) must
    already be of the type: `phones = "4"` is refused. Numbers are finite and never bools."""
    kind = _kind(name)
    if kind in _KINDS:
        if isinstance(value, str) and not typed:
            try:
                value = _KINDS[kind](value.strip())
            except ValueError as e:
                raise UsageError(f"{name} must be {'a whole' if kind == 'int' else 'a'} number, "
                                 f"got {value!r}", subject=where, hint=_fix(where, name)) from e
        elif isinstance(value, bool) or not isinstance(value, (int, float) if kind == "float"
                                                       else int):
            raise UsageError(f"{name} must be {'a whole' if kind == 'int' else 'a'} number, got "
                             f"{value!r} ({type(value).__name__})", subject=where,
                             hint=_fix(where, name))
        assert isinstance(value, (int, float))  # parsed, or refused above
        if kind == "float":
            value = float(value)
            if not math.isfinite(value):
                raise UsageError(f"{name} must be a finite number, got {value!r}", subject=where,
                                 hint=_fix(where, name))
        return value
    if not isinstance(value, (str, os.PathLike)):
        raise UsageError(f"{name} must be a string, got {value!r} ({type(value).__name__})",
                         subject=where, hint=_fix(where, name))
    if kind == "path":
        return Path(os.path.expanduser(str(value)))
    return value if value != "" else None


def load_config(
    flags: dict[str, object] | None = None,
    env: dict[str, str] | None = None,
    config_file: str | os.PathLike | None = None,
) -> FarmConfig:
    """Build the config: flags (None means unset) > FARM_* env > farm.toml > defaults.

    The file is `config_file`, else $FARM_CONFIG, else ./farm.toml when it exists.
    """
    env = dict(os.environ) if env is None else env
    values: JsonDict = {}
    sources: dict[str, str] = {}
    path = config_file or env.get("FARM_CONFIG") or ("farm.toml" if Path("farm.toml").exists() else None)
    if path:
        try:
            data = tomllib.loads(Path(path).read_text())
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
            raise UsageError(f"cannot read config file: {e}", subject=str(path),
                             hint="fix it, or point FARM_CONFIG (or --config) at another file"
                             ) from e
        unknown = set(data) - {"farm", "profiles"}
        if unknown:
            raise UsageError(f"unknown top-level entries {sorted(unknown)}", subject=str(path),
                             hint="a farm.toml has [farm] settings and [profiles.KEY] tables")
        farm = data.get("farm", {})
        if not isinstance(farm, dict):
            raise UsageError("farm must be a table ([farm])", subject=str(path))
        farm = {_OLD.get(k, k): v for k, v in farm.items() if _OLD.get(k) not in farm}
        unknown = (set(farm) - {f.name for f in fields(FarmConfig)}) | (
            {"profiles", "config_file"} & set(farm))
        if unknown:
            raise UsageError(f"unknown settings {sorted(unknown)} in [farm]", subject=str(path),
                             hint="the settings are listed in the README's Configuration "
                                  "section; profiles are [profiles.KEY] tables")
        for k, v in farm.items():
            sources[k] = f"{path} [farm] {k}"
            values[k] = _coerce(k, v, sources[k], typed=True)
        values["profiles"] = check_overrides(data.get("profiles", {}), str(path))
        values["config_file"] = Path(path).resolve()

    env = {**{new: env[old] for old, new in _OLD.items() if old in env and not env.get(new)},
           **env}
    for name, var in _ENV.items():
        if var in SECRET_VARS and not env.get(var) and env.get(f"{var}_FILE"):
            sources[name] = f"{var}_FILE"
            values[name] = _coerce(name, secret(var, env), sources[name])
        elif env.get(var, "") != "":
            sources[name] = var
            values[name] = _coerce(name, env[var], var)
    for name, value in (flags or {}).items():
        if value is not None:
            sources[name] = _FLAGS.get(name, "--" + name.replace("_", "-"))
            values[name] = _coerce(name, value, sources[name])
    return FarmConfig(**values).validate(sources)
