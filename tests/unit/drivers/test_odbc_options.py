"""Connection string options the bridge adds: required ones always, defaults where unset."""

from __future__ import annotations

import pytest

from bridge.dialects.postgresql import POSTGRESQL_DEFAULT_OPTIONS
from bridge.drivers.odbc import with_default_options, with_required_options

BASE = "Driver={PostgreSQL Unicode};Server=db;Database=sender;Uid=bridge;Pwd=${P}"


def test_defaults_are_added_when_the_string_sets_none() -> None:
    assert with_default_options(BASE, POSTGRESQL_DEFAULT_OPTIONS) == (
        "Driver={PostgreSQL Unicode};Server=db;Database=sender;Uid=bridge;Pwd=${P};"
        "CommLog=0;Debug=0;"
    )


@pytest.mark.parametrize("given", ["CommLog=1", "commlog=1", " COMMLOG = 1 "])
def test_a_users_own_value_wins_over_a_default(given: str) -> None:
    result = with_default_options(f"{BASE};{given}", POSTGRESQL_DEFAULT_OPTIONS)
    assert "CommLog=0" not in result
    assert result.endswith(";Debug=0;") and result.lower().count("commlog") == 1


def test_nothing_changes_when_every_default_is_given() -> None:
    text = f"{BASE};CommLog=1;Debug=1"
    assert with_default_options(text, POSTGRESQL_DEFAULT_OPTIONS) is text


def test_required_options_still_replace_the_users_value() -> None:
    text = with_default_options(f"{BASE};Protocol=7.4-1", POSTGRESQL_DEFAULT_OPTIONS)
    result = with_required_options(text, {"Protocol": "7.4-0"})
    assert "Protocol=7.4-1" not in result and result.endswith("Protocol=7.4-0;")
    assert "CommLog=0;Debug=0;" in result
