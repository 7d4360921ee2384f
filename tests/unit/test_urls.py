"""The farm's Redis URLs: one Redis, or Sentinel's primary (farm/core/urls.py)."""

import pytest

from farm.core.config import url_problem
from farm.core.urls import celery_broker, parse_sentinel


def test_a_sentinel_url_names_its_sentinels_primary_password_and_database():
    s = parse_sentinel("sentinel://:p%40ss@10.0.0.1:26379,10.0.0.2:26380/3?master=farm")
    assert s.sentinels == (("10.0.0.1", 26379), ("10.0.0.2", 26380))
    assert (s.master, s.password, s.db) == ("farm", "p@ss", 3)
    assert parse_sentinel("sentinel://h:1?master=m").db == 0
    assert parse_sentinel("sentinel://h:1?master=m").password is None


@pytest.mark.parametrize("url, why", [
    ("sentinel://h:1/0", "?master=NAME"),
    ("sentinel://h/0?master=m", "HOST:PORT"),
    ("sentinel:///0?master=m", "names no sentinel"),
    ("sentinel://h:1/x?master=m", "must be a number"),
    ("sentinel://h:99999/0?master=m", "HOST:PORT"),
])
def test_a_bad_sentinel_url_is_refused_saying_why(url, why):
    assert why in (url_problem(url) or "")


def test_celery_gets_one_url_per_sentinel_and_the_primary_by_name():
    url, options = celery_broker("sentinel://:pw@a:1,b:2/4?master=farm")
    assert url == "sentinel://:pw@a:1/4;sentinel://:pw@b:2/4"
    assert options == {"master_name": "farm", "sentinel_kwargs": {"password": "pw"}}
    assert celery_broker("redis://h:6379/0") == ("redis://h:6379/0", {})
    assert url_problem("sentinel://:pw@a:1,b:2/4?master=farm") is None
