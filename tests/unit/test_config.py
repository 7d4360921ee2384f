import pytest

from farm.config import load_config
from farm.errors import UsageError
from farm.profiles import resolve_profile


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
