"""Bad input, one table: each row runs the real `farm` command (a subprocess, its own
FARM_HOME, cwd and environment) on one bad input and checks that it is refused at once:
a non-zero exit of the error's class, one last line `farm: error: ...` naming the subject,
no traceback, --out not made (or untouched), and nothing started: no FARM_HOME at all, or,
for a command that reads the embedded store, no process of it left running.

The rows run in parallel (a few at a time); each test below checks one row.
"""

from __future__ import annotations

import concurrent.futures
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from farm.core.errors import EXIT_CODES
from farm.local.services import free_port
from tests.helpers import alive, started_pids

pytestmark = pytest.mark.integration

WORKERS = 3  # CLI starts at once (each costs 0.3-10 s of one core: TVM only where needed)
ROW_LIMIT_S = 90.0  # a refusal is quick; starting a farm and tuning is not (loose, shared cores)


@dataclass(frozen=True)
class Row:
    """One bad input. `argv` and `env` values may name {models}, {out}, {tmp}, {dead} (a
    loopback port nothing listens on) and {unwritable} (a folder this process cannot write in)."""

    id: str
    argv: tuple[str, ...]
    code: str  # the name of the expected exit code (farm.core.errors.EXIT_CODES)
    subject: tuple[str, ...]  # substrings of the error line (the subject, the fix)
    env: dict[str, str] = field(default_factory=dict)
    toml: str | None = None  # written to <tmp>/farm.toml, named by FARM_CONFIG
    store: bool = False  # reads the embedded store: its Redis is started, then must be stopped
    setup: Callable[[Path], None] | None = None  # prepares <tmp> (e.g. a non-empty --out)


def submit(model: str, *extra: str) -> tuple[str, ...]:
    return ("submit", f"{{models}}/{model}", "--out", "{out}", "--trials-per-task", "2", *extra)


def keep_out(tmp: Path) -> None:
    (tmp / "out").mkdir()
    (tmp / "out" / "keep.txt").write_text("mine")


GOOD_PROFILE = '[profiles.pixel7]\ntarget = { kind = "llvm" }\n'
LAB = {"FARM_BROKER_URL": "redis://127.0.0.1:{dead}/0"}

ROWS = [
    # the model file
    Row("model-missing", submit("nope.pt2"), "ingest", ("nope.pt2", "no such file")),
    Row("model-empty", submit("empty.pt2"), "ingest", ("empty.pt2", "empty")),
    Row("model-not-a-model", submit("notes.txt"), "ingest", ("notes.txt", "not a model")),
    Row("model-directory", submit("adir"), "ingest", ("adir", "directory")),
    Row("torchscript-without-shape", submit("small.pt"), "usage", ("small.pt", "--input-shape")),
    Row("pickle-without-allow-pickle", submit("pickled.pt", "--input-shape", "2,8"), "usage",
        ("pickled.pt", "--allow-pickle")),
    # shapes and dtype
    Row("shape-not-integers", submit("small.pt", "--input-shape", "1,x,3"), "usage",
        ("--input-shape", "integers")),
    Row("shape-zero-dim", submit("small.pt", "--input-shape", "2,0"), "usage",
        ("--input-shape", "positive")),
    Row("shape-negative-dim", submit("small.pt", "--input-shape", "2,-8"), "usage",
        ("--input-shape", "positive")),
    Row("shape-empty", submit("small.pt", "--input-shape", ""), "usage",
        ("--input-shape", "empty")),
    Row("shape-huge", submit("small.pt", "--input-shape", "1,3,100000,100000"), "usage",
        ("--input-shape 1,3,100000,100000", "limit is 1 GiB")),
    Row("dtype-unknown", submit("small.pt", "--input-shape", "2,8", "--dtype", "float33"),
        "usage", ("--dtype", "float33", "float32")),
    # budgets
    Row("trials-zero", submit("small.pt2", "--trials", "0"), "usage", ("--trials:", ">= 1")),
    Row("name-like-a-job-id", submit("small.pt2", "--name", "20261207-1"), "usage",
        ("--name", "a letter")),
    Row("trials-negative", submit("small.pt2", "--trials", "-1"), "usage", ("--trials:", "-1")),
    Row("trials-per-task-zero", submit("small.pt2", "--trials-per-task", "0"), "usage",
        ("--trials-per-task", ">= 1")),
    Row("early-stop-negative", submit("small.pt2", "--early-stop", "-1"), "usage",
        ("--early-stop", ">= 0")),
    Row("round-trials-zero", submit("small.pt2", "--round-trials", "0"), "usage",
        ("--round-trials", "round_trials must be >= 1")),
    Row("timeout-negative", submit("small.pt2", "--timeout", "-5"), "usage",
        ("--timeout", "> 0")),
    Row("timeout-nan", submit("small.pt2", "--timeout", "nan"), "usage", ("--timeout", "finite")),
    # --out
    Row("out-not-empty", submit("small.pt2"), "usage", ("out", "--force"), setup=keep_out),
    Row("out-parent-unwritable", ("submit", "{models}/small.pt2", "--out", "{unwritable}/out"),
        "usage", ("--out cannot be written",)),
    Row("out-parent-is-a-file", ("submit", "{models}/small.pt2", "--out", "{models}/small.pt/out"),
        "usage", ("--out cannot be made", "not a folder")),
    Row("out-holds-the-model", ("submit", "{models}/small.pt2", "--out", "{models}", "--force"),
        "usage", ("--out would replace",)),
    # device keys
    Row("device-key-typo", submit("small.pt2", "--device-key", "cpu-locl"), "usage",
        ("device key cpu-locl", "cpu-local", "arm64-sim", "[profiles.cpu-locl]")),
    Row("device-key-typo-env", submit("small.pt2"), "usage", ("device key pixel8", "pixel7"),
        env={"FARM_DEVICE_KEY": "pixel8"}, toml=GOOD_PROFILE),
    Row("device-key-opencl-embedded", submit("small.pt2", "--device-key", "android-arm64-opencl"),
        "usage", ("device key android-arm64-opencl", "FARM_BROKER_URL")),
    Row("gpu-lab-job-without-tracker", submit("small.pt2", "--device-key", "android-adreno-7xx"),
        "usage", ("device key android-adreno-7xx", "targets opencl", "--tracker"), env=LAB),
    # --tracker
    Row("tracker-no-port", submit("small.pt2", "--tracker", "localhost"), "usage",
        ("tracker localhost", "HOST:PORT"), env=LAB),
    Row("tracker-bad-port", submit("small.pt2", "--tracker", "127.0.0.1:99999"), "usage",
        ("tracker 127.0.0.1:99999", "HOST:PORT"), env=LAB),
    Row("tracker-not-answering", submit("small.pt2", "--tracker", "127.0.0.1:{dead}"), "service",
        ("tracker 127.0.0.1:", "query_rpc_tracker"), env=LAB),
    Row("no-wait-with-embedded-farm", submit("small.pt2", "--no-wait"), "usage",
        ("--no-wait", "FARM_BROKER_URL")),
    Row("tracker-with-embedded-farm", submit("small.pt2", "--tracker", "127.0.0.1:9190"), "usage",
        ("tracker 127.0.0.1:9190", "lab farm")),
    # farm.toml
    Row("toml-syntax-error", submit("small.pt2"), "usage", ("farm.toml", "cannot read config"),
        toml="[farm\nphones = 2\n"),
    Row("toml-unknown-setting", submit("small.pt2"), "usage", ("farm.toml", "phonez"),
        toml="[farm]\nphonez = 2\n"),
    Row("toml-unknown-table", submit("small.pt2"), "usage", ("farm.toml", "['profile']"),
        toml="[profile.pixel7]\nthreads = 4\n"),
    Row("toml-string-for-number", submit("small.pt2"), "usage", ("[farm] phones", "'4'"),
        toml='[farm]\nphones = "4"\n'),
    Row("toml-inf", submit("small.pt2"), "usage", ("[farm] round_timeout_s", "finite"),
        toml="[farm]\nround_timeout_s = inf\n"),
    Row("toml-profile-threads-string", submit("small.pt2"), "usage",
        ("[profiles.pixel7]", "threads", "'4'"), toml=GOOD_PROFILE + 'threads = "4"\n'),
    Row("toml-profile-threads-bool", submit("small.pt2"), "usage",
        ("[profiles.pixel7]", "threads", "True"), toml=GOOD_PROFILE + "threads = true\n"),
    Row("toml-profile-unknown-setting", submit("small.pt2"), "usage",
        ("[profiles.pixel7]", "thread"), toml=GOOD_PROFILE + "thread = 4\n"),
    Row("toml-target-attribute-type", submit("small.pt2"), "usage",
        ("profile cpu-local", "mcpu", "expected type 'str'"),
        toml='[profiles.cpu-local]\ntarget = { kind = "llvm", mcpu = 5 }\n'),
    Row("toml-missing", submit("small.pt2"), "usage", ("nowhere.toml", "cannot read config"),
        env={"FARM_CONFIG": "{tmp}/nowhere.toml"}),
    # environment
    Row("env-phones-word", submit("small.pt2"), "usage", ("FARM_PHONES", "'two'"),
        env={"FARM_PHONES": "two"}),
    Row("env-run-timeout-nan", submit("small.pt2"), "usage", ("FARM_RUN_TIMEOUT_S", "finite"),
        env={"FARM_RUN_TIMEOUT_S": "nan"}),
    Row("env-round-timeout-inf", submit("small.pt2"), "usage",
        ("FARM_ROUND_TIMEOUT_S", "finite"), env={"FARM_ROUND_TIMEOUT_S": "inf"}),
    Row("env-host-ttl-word", submit("small.pt2"), "usage", ("FARM_HOST_TTL_S", "'abc'"),
        env={"FARM_HOST_TTL_S": "abc"}),
    Row("env-host-ttl-word-status", ("status",), "usage", ("FARM_HOST_TTL_S",),
        env={"FARM_HOST_TTL_S": "abc"}),
    Row("env-broker-url-no-scheme", submit("small.pt2"), "usage",
        ("FARM_BROKER_URL", "host:6379", "redis://"), env={"FARM_BROKER_URL": "host:6379"}),
    Row("env-broker-url-bad-port", ("status",), "usage", ("FARM_BROKER_URL", "port"),
        env={"FARM_BROKER_URL": "redis://:secret@host:port/0"}),
    Row("env-maxmemory", submit("small.pt2"), "usage", ("FARM_REDIS_MAXMEMORY", "4 gigs"),
        env={"FARM_REDIS_MAXMEMORY": "4 gigs"}),
    Row("env-home-is-a-file", ("status",), "usage", ("notes.txt", "not a folder", "FARM_HOME"),
        env={"FARM_HOME": "{models}/notes.txt"}),
    # job ids (the embedded store's Redis is started to look: it must be stopped after)
    Row("status-no-such-job", ("status", "nope"), "store", ("job nope", "no such job"),
        store=True),
    Row("resume-no-such-job", ("resume", "nope"), "store", ("job nope", "no such job"),
        store=True),
    Row("cancel-no-such-job", ("cancel", "nope"), "store", ("job nope", "no such job"),
        store=True),
    Row("wait-on-embedded-farm", ("wait", "nope"), "usage", ("job nope", "farm resume nope")),
    Row("status-lab-unreachable", ("status", "nope"), "service", ("127.0.0.1:", "redis-cli"),
        env=LAB),
    # farm cache import: a folder that is no JSONDatabase is refused before the store opens;
    # a malformed one is read record by record from the store's side
    Row("cache-import-missing-folder", ("cache", "import", "{tmp}/nothing"), "usage",
        ("nothing", "JSONDatabase")),
    Row("cache-import-not-a-database", ("cache", "import", "{models}/adir"), "usage",
        ("adir", "JSONDatabase")),
    Row("cache-import-malformed-json", ("cache", "import", "{models}/baddb"), "usage",
        ("baddb", "refused"), store=True),
    Row("cache-import-nested-json", ("cache", "import", "{tmp}/deep"), "usage",
        ("deep", "refused"), store=True, setup=lambda tmp: _deep_log(tmp / "deep")),
    Row("cache-export-onto-a-file", ("cache", "export", "{models}/notes.txt"), "usage",
        ("notes.txt", "is a file"), store=True),
    # farm status, farm report
    Row("status-interval-negative", ("status", "--watch", "--interval", "-1"), "usage",
        ("--interval -1", "> 0")),
    Row("status-interval-nan", ("status", "--watch", "--interval", "nan"), "usage",
        ("--interval nan", "finite")),
    Row("home-cannot-be-made", ("status",), "usage", ("/proc/1/nope", "cannot be made"),
        env={"FARM_HOME": "/proc/1/nope"}),
    Row("report-summary-empty", ("report", "{tmp}/rep"), "store",
        ("rep", "not a job's summary"), setup=lambda tmp: _file(tmp / "rep/summary.json", "{}")),
]


def _file(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def _deep_log(folder: Path) -> None:
    """A JSONDatabase whose lines are nested 100,000 deep (json.loads: RecursionError)."""
    for name in ("database_workload.json", "database_tuning_record.json"):
        _file(folder / name, "[" * 100000 + "]" * 100000 + "\n")


@dataclass
class Ran:
    code: int
    stderr: str
    seconds: float
    tmp: Path
    out: Path
    out_before: dict[str, bytes] | None


def snapshot(folder: Path) -> dict[str, bytes] | None:
    if not folder.exists():
        return None
    return {str(p.relative_to(folder)): (p.read_bytes() if p.is_file() else b"<dir>")
            for p in sorted(folder.rglob("*"))}


def unwritable(root: Path) -> Path:
    """A folder this process cannot make anything in: permission bits do not stop root."""
    if os.geteuid() == 0:
        return Path("/sys/tunefarm-bad-input")  # /sys takes no new entries, even from root
    ro = root / "read-only"
    ro.mkdir(exist_ok=True)
    ro.chmod(0o500)
    return ro


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import torch

    d = tmp_path_factory.mktemp("bad-input-models")
    x = torch.randn(2, 8)
    small = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.ReLU()).eval()
    torch.export.save(torch.export.export(small, (x,)), d / "small.pt2")
    torch.jit.save(torch.jit.trace(small, x), d / "small.pt")
    torch.save(small, d / "pickled.pt")  # never unpickled: refused without --allow-pickle
    (d / "empty.pt2").write_bytes(b"")
    (d / "notes.txt").write_text("not a model\n")
    (d / "adir").mkdir()
    (d / "baddb").mkdir()
    (d / "baddb" / "database_workload.json").write_text('["not a workload"\n{{{\n')
    (d / "baddb" / "database_tuning_record.json").write_text("[0, {\n not json\n")
    return d


def run_row(row: Row, models: Path, root: Path) -> Ran:
    tmp = root / row.id
    tmp.mkdir()
    names = {"models": str(models), "out": str(tmp / "out"), "tmp": str(tmp),
             "dead": str(free_port()), "unwritable": str(unwritable(root))}
    env = {k: v for k, v in os.environ.items() if not k.startswith("FARM_")}
    env["FARM_HOME"] = str(tmp / "home")
    if row.toml is not None:
        (tmp / "farm.toml").write_text(row.toml)
        env["FARM_CONFIG"] = str(tmp / "farm.toml")
    env.update({k: v.format(**names) for k, v in row.env.items()})
    if row.setup is not None:
        row.setup(tmp)
    argv = [a.format(**names) for a in row.argv]
    out = Path(argv[argv.index("--out") + 1]) if "--out" in argv else tmp / "out"
    before = snapshot(out)
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "farm", *argv], cwd=tmp, env=env,
                          capture_output=True, text=True, timeout=300)
    return Ran(proc.returncode, proc.stderr, time.monotonic() - t0, tmp, out, before)


@pytest.fixture(scope="module")
def ran(request: pytest.FixtureRequest, models: Path,
        tmp_path_factory: pytest.TempPathFactory) -> dict[str, Ran]:
    """Every row selected in this session, run WORKERS at a time."""
    wanted = {item.callspec.params["row"].id for item in request.session.items
              if item.module is request.module and hasattr(item, "callspec")
              and "row" in item.callspec.params}
    root = tmp_path_factory.mktemp("bad-input")
    t0 = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(WORKERS) as pool:
        futures = {r.id: pool.submit(run_row, r, models, root) for r in ROWS if r.id in wanted}
        results = {k: f.result() for k, f in futures.items()}
    print(f"\nbad-input table: {len(results)} rows in {time.monotonic() - t0:.1f} s "
          f"({WORKERS} at a time)")
    return results


@pytest.mark.parametrize("row", ROWS, ids=lambda r: r.id)
def test_bad_input_is_refused_at_once(row: Row, ran: dict[str, Ran]) -> None:
    r = ran[row.id]
    assert "Traceback" not in r.stderr, r.stderr
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert lines and lines[-1].startswith("farm: error: "), r.stderr
    assert sum(line.startswith("farm: error:") for line in lines) == 1, r.stderr
    for needle in row.subject:
        assert needle in lines[-1], (needle, lines[-1])
    assert r.code == EXIT_CODES[row.code], (r.code, lines[-1])
    # nothing written: --out as it was (absent, or the user's files untouched), nothing staged
    assert snapshot(r.out) == r.out_before, lines[-1]
    if r.out.parent.exists():
        assert not list(r.out.parent.glob(f".{r.out.name}.*")), list(r.out.parent.iterdir())
    home = r.tmp / "home"
    if row.store:  # the embedded store's Redis was started to look: all of it stopped again
        assert not (home / "running.json").exists()
        left = [(pid, name) for pid, name in started_pids(home) if alive(pid)]
        assert not left, left
    else:  # nothing started: not even FARM_HOME made
        assert not home.exists(), sorted(p.name for p in home.rglob("*"))
    assert r.seconds < ROW_LIMIT_S, r.seconds


def test_a_tracker_is_checked_for_phones_of_the_key_before_anything_is_sent(tmp_path):
    """The good side of the --tracker rows: a tracker that answers with a phone of the key
    passes; one without such a phone is refused (naming the keys it has) unless the job
    waits for devices; a port where no tracker answers is refused at once."""
    from farm.core.errors import ServiceError
    from farm.devices.tracker import wait_for_phones
    from farm.local import services
    from farm.pipeline.preflight import check_tracker

    group = services.ServiceGroup()
    try:
        svc, tracker = services.start_tracker(tmp_path)
        group.add(svc)
        group.add(services.start_phone(tracker, "cpu-local", 0, tmp_path))
        wait_for_phones(tracker, "cpu-local", 1, 60)
        check_tracker(tracker, "cpu-local", wait_s=0)
        with pytest.raises(ServiceError, match=r"no phone of key 'pixel7'.*keys there: cpu-local"):
            check_tracker(tracker, "pixel7", wait_s=0)
        check_tracker(tracker, "pixel7", wait_s=60)  # the job will wait for such a phone
        t0 = time.monotonic()
        with pytest.raises(ServiceError, match="cannot reach the TVM RPC tracker"):
            check_tracker(f"127.0.0.1:{free_port()}", "cpu-local", wait_s=0)
        assert time.monotonic() - t0 < 10
    finally:
        group.stop()
