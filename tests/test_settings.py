"""Settings from SUPERSERIAL_* environment variables: defaults, values, and errors naming the variable."""

from __future__ import annotations

from typing import Any

import pytest

from superserial.base import settings
from superserial.read import readahead
from superserial.storage import fetch, retry

NAME = "SUPERSERIAL_TEST_SETTING"


@pytest.mark.parametrize(
    ("parse", "default", "text", "want"),
    [
        (settings.count, 7, "", 7),
        (settings.count, 7, " 12 ", 12),
        (settings.seconds, 1.5, "", 1.5),
        (settings.seconds, 1.5, "0", 0.0),
        (settings.seconds, 1.5, "2.25", 2.25),
        (settings.size, 10, "", 10),
        (settings.size, 10, "0", 0),
        (settings.size, 10, "2KiB", 2048),
        (settings.size, 10, "1kB", 1000),
        (settings.flag, True, "", True),
        (settings.flag, True, "0", False),
        (settings.flag, False, " On ", True),
        (settings.flag, False, "yes", True),
        (settings.flag, True, "False", False),
    ],
)
def test_a_setting_is_its_default_or_its_value(
    parse: Any, default: Any, text: str, want: Any, monkeypatch: Any
) -> None:
    monkeypatch.setenv(NAME, text)
    assert parse(NAME, default) == want


@pytest.mark.parametrize(
    ("parse", "text", "expected"),
    [
        (settings.count, "0", "a positive integer"),
        (settings.count, "2.5", "a positive integer"),
        (settings.count, "many", "a positive integer"),
        (settings.seconds, "-1", "seconds >= 0"),
        (settings.seconds, "nan", "seconds >= 0"),
        (settings.seconds, "soon", "seconds >= 0"),
        (settings.size, "lots", "a number of bytes"),
        (settings.flag, "maybe", "1 or 0 (on or off)"),
        (settings.flag, "2", "1 or 0 (on or off)"),
    ],
)
def test_a_bad_setting_names_the_variable_and_its_value(
    parse: Any, text: str, expected: str, monkeypatch: Any
) -> None:
    monkeypatch.setenv(NAME, text)
    with pytest.raises(ValueError, match=rf"expected.*{NAME}.*{text!r}") as e:
        parse(NAME, 1)
    assert expected in str(e.value)


def test_zero_seconds_can_be_refused(monkeypatch: Any) -> None:
    monkeypatch.setenv(NAME, "0")
    with pytest.raises(ValueError, match=rf"expected {NAME} to be seconds > 0, got '0'"):
        settings.seconds(NAME, 1.0, zero=False)


@pytest.mark.parametrize(
    ("read", "name", "default"),
    [
        (fetch.concurrency, fetch.CONCURRENCY_ENV, fetch.DEFAULT_CONCURRENCY),
        (retry.budget, retry.RETRY_SECONDS_ENV, 60.0),
        (retry.request_timeout, retry.REQUEST_TIMEOUT_ENV, 20.0),
        (readahead.budget, readahead.READ_AHEAD_ENV, readahead.DEFAULT_READ_AHEAD),
    ],
)
def test_each_knob_reads_its_own_variable(
    read: Any, name: str, default: Any, monkeypatch: Any
) -> None:
    monkeypatch.delenv(name, raising=False)
    assert read() == default
    monkeypatch.setenv(name, "3")
    assert read() == 3
    monkeypatch.setenv(name, "-3")
    with pytest.raises(ValueError, match=name):
        read()
