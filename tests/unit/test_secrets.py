"""Secrets from the environment or a file only their owner reads."""

from __future__ import annotations

import pytest

from farm.core.errors import UsageError
from farm.core.secrets import secret


def test_a_secret_comes_from_the_variable_or_a_private_file(tmp_path):
    path = tmp_path / "url"
    path.write_text("redis://:pw@host:6379/0\n")
    path.chmod(0o600)
    assert secret("FARM_BROKER_URL", {"FARM_BROKER_URL": "redis://x"}) == "redis://x"
    assert secret("FARM_BROKER_URL", {"FARM_BROKER_URL_FILE": str(path)}) == \
        "redis://:pw@host:6379/0"
    assert secret("FARM_BROKER_URL", {}) is None


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604])
def test_a_file_others_can_read_is_refused(tmp_path, mode):
    path = tmp_path / "auth"
    path.write_text("admin:pw")
    path.chmod(mode)
    with pytest.raises(UsageError, match="chmod 600"):
        secret("FARM_FLOWER_AUTH", {"FARM_FLOWER_AUTH_FILE": str(path)})


def test_a_missing_or_empty_file_is_a_clear_error(tmp_path):
    with pytest.raises(UsageError, match="cannot read it"):
        secret("FARM_FLOWER_AUTH", {"FARM_FLOWER_AUTH_FILE": str(tmp_path / "nope")})
    empty = tmp_path / "empty"
    empty.write_text("")
    empty.chmod(0o600)
    with pytest.raises(UsageError, match="empty"):
        secret("FARM_FLOWER_AUTH", {"FARM_FLOWER_AUTH_FILE": str(empty)})


def test_the_config_reads_the_broker_url_from_a_private_file(tmp_path):
    from farm.core.config import load_config

    path = tmp_path / "broker"
    path.write_text("redis://:pw@127.0.0.1:6390/0\n")
    path.chmod(0o600)
    config = load_config(env={"FARM_BROKER_URL_FILE": str(path)})
    assert config.broker_url == "redis://:pw@127.0.0.1:6390/0"
    path.chmod(0o644)
    with pytest.raises(UsageError, match="chmod 600"):
        load_config(env={"FARM_BROKER_URL_FILE": str(path)})
