"""The operator's log: its level and its format (text or JSON), from COMPASS_* or the command line.

The chart sets COMPASS_LOG_LEVEL and COMPASS_LOG_FORMAT (tests/repo/test_chart_render.py); a
real operator process logging JSON is tests/k8s/test_operator_log.py.
"""

from __future__ import annotations

import io
import json
import logging
import re
from collections.abc import Iterator

import pytest

from compass.commands.main import build_parser
from compass.commands.operator import with_command_line
from compass.controllers.logs import configure_logging
from compass.controllers.settings import OperatorSettings


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    """configure_logging changes the process's root and asyncio loggers: put them back."""
    root, asyncio_logger = logging.getLogger(), logging.getLogger("asyncio")
    saved = (root.level, root.handlers[:], asyncio_logger.propagate, asyncio_logger.handlers[:])
    yield
    root.level, root.handlers[:], asyncio_logger.propagate, asyncio_logger.handlers[:] = saved


def _lines(stream: io.StringIO) -> list[str]:
    return stream.getvalue().splitlines()


def test_json_is_one_object_a_line_with_the_resource_it_is_about() -> None:
    stream = io.StringIO()
    configure_logging("info", "json", stream)
    logging.getLogger("compass.controllers.manager").info("watching %s", "team-a")
    logging.getLogger("compass.controllers.manager").debug("not at info")
    # What kopf's per-object loggers put on a record (kopf.ObjectLogger): the resource.
    reference = {
        "apiVersion": "compass.io/v1alpha1",
        "kind": "ParetoPolicy",
        "namespace": "team-a",
        "name": "rag",
        "uid": "",
    }
    logging.getLogger("kopf.objects").warning("switch failed", extra={"k8s_ref": reference})
    try:
        raise RuntimeError("boom\nsecond line")
    except RuntimeError:
        logging.getLogger("compass.controllers.policy_handlers").exception("timer crashed")

    first, second, third = (json.loads(line) for line in _lines(stream))
    assert first == {
        "time": first["time"],
        "level": "info",
        "logger": "compass.controllers.manager",
        "message": "watching team-a",
    }
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}\+00:00", first["time"])
    assert second["level"] == "warning"
    assert second["object"] == {  # the empty uid left out
        "apiVersion": "compass.io/v1alpha1",
        "kind": "ParetoPolicy",
        "namespace": "team-a",
        "name": "rag",
    }
    assert third["level"] == "error"
    assert third["exception"].startswith("Traceback")
    assert "RuntimeError: boom\nsecond line" in third["exception"]


def test_text_is_kopfs_layout_and_the_level_is_the_floor() -> None:
    stream = io.StringIO()
    configure_logging("warning", "text", stream)
    logging.getLogger("compass.controllers.manager").info("not at warning")
    logging.getLogger("compass.controllers.manager").warning("CRDs missing")
    [line] = _lines(stream)
    assert re.fullmatch(
        r"\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}\] compass.controllers. \[WARNING \] CRDs missing",
        line,
    )


def test_a_second_configuration_replaces_the_first() -> None:
    """One line a record even when configured twice (the operator restarts kopf in-process)."""
    first, second = io.StringIO(), io.StringIO()
    configure_logging("info", "text", first)
    configure_logging("debug", "json", second)
    logging.getLogger("compass.test").debug("once")
    assert _lines(first) == []
    assert [json.loads(line)["message"] for line in _lines(second)] == ["once"]


def test_asyncio_is_quiet_below_debug() -> None:
    """asyncio's records repeat what kopf reports: dropped unless debugging (kopf does too)."""
    stream = io.StringIO()
    configure_logging("info", "text", stream)
    logging.getLogger("asyncio").warning("Task was destroyed but it is pending!")
    assert _lines(stream) == []
    configure_logging("debug", "text", stream)
    logging.getLogger("asyncio").warning("Task was destroyed but it is pending!")
    assert len(_lines(stream)) == 1


def test_command_line_wins_over_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COMPASS_LOG_LEVEL", "WARNING")  # as logging spells it
    monkeypatch.setenv("COMPASS_LOG_FORMAT", "JSON")
    settings = OperatorSettings()
    assert (settings.log_level, settings.log_format) == ("warning", "json")
    parser = build_parser(["operator"])

    def chosen(*argv: str) -> tuple[str, str]:
        applied = with_command_line(settings, parser.parse_args(["operator", *argv]))
        return applied.log_level, applied.log_format

    assert chosen() == ("warning", "json")
    assert chosen("--log-level", "error", "--log-format", "text") == ("error", "text")
    assert chosen("--verbose") == ("debug", "json")


@pytest.mark.parametrize(
    ("name", "value"), [("COMPASS_LOG_LEVEL", "loud"), ("COMPASS_LOG_FORMAT", "logfmt")]
)
def test_a_bad_log_setting_names_the_choices(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], name: str, value: str
) -> None:
    from compass.commands.main import main

    monkeypatch.setenv(name, value)
    assert main(["operator"]) == 2
    error = capsys.readouterr().err
    assert name.removeprefix("COMPASS_").lower() in error
    assert ("'debug', 'info'" if "LEVEL" in name else "'text' or 'json'") in error
