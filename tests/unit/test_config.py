import pytest

from farm.core.config import load_config
from farm.core.errors import UsageError
from farm.core.profiles import BUILTIN_PROFILES, known_keys, resolve_profile


def test_precedence_flag_over_env_over_file_over_default(tmp_path):
    toml = tmp_path / "farm.toml"
    toml.write_text('[farm]\nround_trials = 8\nphones = 3\nrun_timeout_s = 12.5\n'
                    '[profiles.pixel7]\nthreads = 4\ntarget = { kind = "llvm", mtriple = '
                    '"aarch64-linux-android" }\n')
    env = {"FARM_PHONES": "5", "FARM_DEVICE_WAIT_S": "7"}
    cfg = load_config({"phones": 9, "round_trials": None}, env=env, config_file=toml)
    assert cfg.phones == 9  # flag
    assert cfg.device_wait_s == 7.0  # env
    assert cfg.round_trials == 8 and cfg.run_timeout_s == 12.5  # file
    assert cfg.build_timeout_s == 60.0  # default
    profile = resolve_profile("pixel7", cfg.profiles)
    assert profile.threads == 4
    assert profile.target_json() == {"kind": "llvm", "mtriple": "aarch64-linux-android",
                                     "num-cores": 4}


def test_zero_is_not_replaced_by_a_default():
    with pytest.raises(UsageError, match="round_trials must be >= 1, got 0"):
        load_config({"round_trials": 0}, env={})


def test_bad_values_are_named(tmp_path):
    with pytest.raises(UsageError, match="phones"):
        load_config({}, env={"FARM_PHONES": "many"})
    bad = tmp_path / "farm.toml"
    bad.write_text("[farm]\nwhat = 1\n")
    with pytest.raises(UsageError, match="unknown settings"):
        load_config({}, env={}, config_file=bad)


def test_unknown_device_keys_default_to_this_cpu():
    profile = resolve_profile("lab-phone-3")
    assert profile.key == "lab-phone-3" and profile.target_json()["kind"] == "llvm"


def test_unknown_device_keys_are_refused_where_a_job_is_submitted():
    with pytest.raises(UsageError) as e:
        resolve_profile("cpu-locl", strict=True)
    text = str(e.value)
    assert "device key cpu-locl" in text and "[profiles.cpu-locl]" in text
    assert "known keys: " + ", ".join(BUILTIN_PROFILES) in text
    for key in BUILTIN_PROFILES:  # built-ins keep working
        assert resolve_profile(key, strict=True).key == key
    declared = {"pixel7": {"target": {"kind": "llvm"}}}  # a profile given explicitly
    assert resolve_profile("pixel7", declared, strict=True).target_json()["kind"] == "llvm"
    assert known_keys(declared)[-1] == "pixel7"


@pytest.mark.parametrize("setting, needle", [
    ('threads = "4"', "threads must be of type int, got '4' (str)"),
    ("threads = true", "threads must be of type int, got True (bool)"),
    ("threads = 0", "threads must be a finite number >= 1"),
    ("number = 2.5", "number must be of type int"),
    ("cooldown_s = inf", "cooldown_s must be a finite number >= 0"),
    ('export = "ftp"', "export must be one of ['local', 'cross']"),
    ("thread = 4", "unknown settings ['thread']"),
    ('key = "pixel8"', "differs from the table's name"),
    ('target = { mtriple = "aarch64-linux-android" }', "target must be a table with a 'kind'"),
])
def test_a_bad_profile_in_farm_toml_is_refused_when_the_config_is_loaded(tmp_path, setting,
                                                                         needle):
    toml = tmp_path / "farm.toml"
    toml.write_text(f'[profiles.pixel7]\ntarget = {{ kind = "llvm" }}\n{setting}\n'
                    if not setting.startswith("target") else f"[profiles.pixel7]\n{setting}\n")
    with pytest.raises(UsageError) as e:
        load_config({}, env={}, config_file=toml)
    assert needle in str(e.value) and f"{toml} [profiles.pixel7]" in str(e.value)


@pytest.mark.parametrize("env, needle", [
    ({"FARM_ROUND_TIMEOUT_S": "inf"}, "FARM_ROUND_TIMEOUT_S: round_timeout_s must be a finite"),
    ({"FARM_RUN_TIMEOUT_S": "nan"}, "FARM_RUN_TIMEOUT_S: run_timeout_s must be a finite"),
    ({"FARM_PHONE_DELAY_S": "-1"}, "FARM_PHONE_DELAY_S: phone_delay_s must be >= 0"),
    ({"FARM_PHONES": "2.5"}, "FARM_PHONES: phones must be a whole number, got '2.5'"),
    ({"FARM_HOST_TTL_S": "abc"}, "FARM_HOST_TTL_S: host_ttl_s must be a whole number, got 'abc'"),
    ({"FARM_HOST_TTL_S": "0"}, "FARM_HOST_TTL_S: host_ttl_s must be >= 1"),
    ({"FARM_REDIS_MAXMEMORY": "lots"}, "FARM_REDIS_MAXMEMORY"),
])
def test_environment_numbers_must_be_finite_and_of_their_type(env, needle):
    with pytest.raises(UsageError) as e:
        load_config({}, env=env)
    assert needle in str(e.value)


@pytest.mark.parametrize("line, needle", [
    ('phones = "4"', "[farm] phones: phones must be a whole number, got '4' (str)"),
    ("phones = true", "phones must be a whole number, got True (bool)"),
    ("phones = 2.5", "phones must be a whole number, got 2.5 (float)"),
    ("round_timeout_s = inf", "round_timeout_s must be a finite number, got inf"),
    ("run_timeout_s = nan", "run_timeout_s must be a finite number, got nan"),
    ("device_key = 7", "device_key must be a string, got 7"),
    ("profiles = {}", "unknown settings ['profiles'] in [farm]"),
])
def test_farm_toml_values_must_be_of_their_type(tmp_path, line, needle):
    toml = tmp_path / "farm.toml"
    toml.write_text(f"[farm]\n{line}\n")
    with pytest.raises(UsageError) as e:
        load_config({}, env={}, config_file=toml)
    assert needle in str(e.value) and str(toml) in str(e.value)


def test_farm_toml_numbers_of_the_right_type_are_taken(tmp_path):
    toml = tmp_path / "farm.toml"
    toml.write_text("[farm]\nrun_timeout_s = 12\nphones = 3\nredis_maxmemory = \"512mb\"\n")
    cfg = load_config({}, env={"FARM_ROUND_TIMEOUT_S": " 60 "}, config_file=toml)
    assert cfg.run_timeout_s == 12.0 and isinstance(cfg.run_timeout_s, float)
    assert cfg.phones == 3 and cfg.round_timeout_s == 60.0 and cfg.redis_maxmemory == "512mb"


def test_a_malformed_farm_toml_names_the_file(tmp_path):
    bad = tmp_path / "farm.toml"
    bad.write_text("[farm\nphones = 2\n")
    with pytest.raises(UsageError, match="cannot read config file") as e:
        load_config({}, env={}, config_file=bad)
    assert str(bad) in str(e.value)
    bad.write_text("[profile.pixel7]\nthreads = 4\n")  # a typo of [profiles.pixel7]
    with pytest.raises(UsageError, match=r"unknown top-level entries \['profile'\]"):
        load_config({}, env={}, config_file=bad)
    with pytest.raises(UsageError, match="cannot read config file"):
        load_config({}, env={"FARM_CONFIG": str(tmp_path / "missing.toml")})


@pytest.mark.parametrize("url", ["redis://host:6379/0", "redis://localhost", "redis://h:6379",
                                 "rediss://:pw@h:6380/1", "redis://user:pw@10.0.0.2:6379/15",
                                 "unix:///run/redis.sock"])
def test_redis_urls_are_taken(url):
    assert load_config({"broker_url": url}, env={}).broker_url == url


@pytest.mark.parametrize("url, needle", [
    ("host:6379", "(it has none)"), ("http://host:6379/0", "not http://"),
    ("redis://:6379/0", "names no host"), ("redis://h:port/0", "port"),
    ("redis://h:99999/0", "port"), ("redis://h:6379/zero", "database"),
    ("redis://:s3cret@h:port/0", "port"),
])
def test_a_malformed_broker_url_is_refused_without_its_password(url, needle):
    with pytest.raises(UsageError) as e:
        load_config({}, env={"FARM_BROKER_URL": url})
    text = str(e.value)
    assert text.startswith("FARM_BROKER_URL: ") and needle in text and "s3cret" not in text
    with pytest.raises(UsageError, match="^--broker: "):
        load_config({"broker_url": url}, env={})


def test_host_ttl_is_a_setting_like_the_others(monkeypatch):
    import importlib

    from farm.core import keys

    monkeypatch.setenv("FARM_HOST_TTL_S", "abc")
    importlib.reload(keys)  # importing never reads the environment (it used to crash)
    assert load_config({}, env={"FARM_HOST_TTL_S": "6"}).host_ttl_s == 6
    assert load_config({}, env={}).host_ttl_s == 30


def test_a_config_file_reaches_the_processes_the_embedded_farm_starts(tmp_path):
    from farm.local.embedded import config_env

    toml = tmp_path / "lab.toml"
    toml.write_text('[profiles.cpu-local]\nthreads = 2\n')
    config = load_config({}, env={}, config_file=toml)
    assert config.config_file == toml.resolve()
    env = config_env(config)
    assert env["FARM_CONFIG"] == str(toml.resolve())
    child = load_config({}, env=env)  # what the embedded worker builds from its environment
    assert child.profiles == config.profiles and child.profiles["cpu-local"]["threads"] == 2
    assert "FARM_CONFIG" not in config_env(load_config({}, env={}))


def test_search_population_is_a_setting_that_reaches_the_search():
    # MetaSchedule's 512 schedules for batches of 64, for the farm's batches of 16
    assert load_config(env={}).search_population == 128
    assert load_config(env={"FARM_SEARCH_POPULATION": "64"}).search_population == 64
    with pytest.raises(UsageError, match="search_population must be >= 1"):
        load_config(env={"FARM_SEARCH_POPULATION": "0"})
    from workers.metaschedule.search import evolutionary

    small = evolutionary(8)  # fewer schedules than MetaSchedule's init_min_unmeasured (50)
    assert small.population_size == 8 and small.init_min_unmeasured == 8


def test_search_iters_is_a_setting_that_reaches_the_search():
    # 2 genetic iterations per batch, not MetaSchedule's 4 (bench/cpu.md)
    assert load_config(env={}).search_iters == 2
    assert load_config(env={"FARM_SEARCH_ITERS": "4"}).search_iters == 4
    with pytest.raises(UsageError, match="search_iters must be >= 1"):
        load_config(env={"FARM_SEARCH_ITERS": "0"})
    from workers.metaschedule.search import evolutionary

    assert evolutionary(8, 3).genetic_num_iters == 3
    assert evolutionary(8).genetic_num_iters == load_config(env={}).search_iters


@pytest.mark.parametrize("password", ["a/b", "p@ss", "x:y#z", "q?r&s"])
def test_a_password_is_redacted_and_url_encoded_whatever_it_holds(password):
    import redis

    from farm.core.config import redact, with_password

    url = with_password("redis://127.0.0.1:6379/0", password)
    assert redis.connection.parse_url(url)["password"] == password  # what Redis is sent
    assert redact(url) == "redis://***@127.0.0.1:6379/0"
    raw = f"redis://:{password}@host:6379/0"  # as a user may write it, not encoded
    assert password not in redact(raw) and redact(raw).endswith("host:6379/0")


def test_lend_search_is_understood_by_its_name_before(tmp_path):
    """`borrow_search` (farm.toml), FARM_BORROW_SEARCH and --borrow-search: the setting's name
    before it became lend_search (docs/architecture.md's glossary); the new name wins."""
    from farm.client.cli import build_parser
    from farm.core.config import load_config

    old = tmp_path / "old.toml"
    old.write_text('[farm]\nborrow_search = "never"\n')
    assert load_config(env={}, config_file=old).lend_search == "never"
    both = tmp_path / "both.toml"
    both.write_text('[farm]\nborrow_search = "never"\nlend_search = "always"\n')
    assert load_config(env={}, config_file=both).lend_search == "always"
    assert load_config(env={"FARM_BORROW_SEARCH": "always"}).lend_search == "always"
    assert load_config(env={"FARM_BORROW_SEARCH": "always",
                            "FARM_LEND_SEARCH": "never"}).lend_search == "never"
    assert build_parser().parse_args(["worker", "--borrow-search", "never"]).lend_search == "never"
