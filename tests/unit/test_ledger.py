"""Ledger files: reading both formats, merging batches, replay, and every error message."""

from __future__ import annotations

import gc
import json
import logging
import sys
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

import pytest

from compass.domain.evaluation import EvaluationError, ParamValue
from compass.evaluators.ledger import (
    Ledger,
    LedgerError,
    ReplayEvaluator,
    TruncatedLineError,
    parse_ledger,
    read_ledger,
)

A: dict[str, ParamValue] = {"retriever_k": 5, "model": "small"}
B: dict[str, ParamValue] = {"retriever_k": 10, "model": "large"}


def _write(path: Path, *lines: str) -> Path:
    path.write_text("".join(line + "\n" for line in lines))
    return path


def test_replay_format_round_trips(tmp_path: Path) -> None:
    """Each line's scores land at indices 0..n-1, configurations in first-seen order."""
    path = _write(
        tmp_path / "rag.jsonl",
        json.dumps({"config": A, "scores": [0.0, 1.0, 0.5]}),
        json.dumps({"config": B, "scores": [1, 1]}),
    )
    ledger = read_ledger(path)
    assert len(ledger) == 2
    assert ledger.configs() == [A, B]
    assert ledger.scores(A) == {0: 0.0, 1: 1.0, 2: 0.5}
    assert ledger.scores(B) == {0: 1.0, 1: 1.0}
    assert ledger.complete_length(A) == 3
    assert ledger.fact_count == 5
    replay = ReplayEvaluator(ledger)
    assert replay.evaluate(A, [2, 0]) == [0.5, 0.0]
    assert replay.evaluate(B, []) == []


def test_checkpoint_batches_merge_by_config_and_index(tmp_path: Path) -> None:
    """Batches of one configuration merge; equal configs written differently are one config."""
    path = _write(
        tmp_path / "ckpt.jsonl",
        json.dumps({"config": A, "samples": [4, 0], "scores": [0.4, 0.0]}),
        "",
        '{"config": {"model": "small", "retriever_k": 5.0}, "samples": [1, 2], "scores": [0.1, 0.2]}',
        # Repeating a fact with the same score is harmless.
        json.dumps({"config": A, "samples": [0], "scores": [0.0]}),
    )
    ledger = read_ledger(path)
    assert len(ledger) == 1
    assert ledger.configs() == [A]
    assert ledger.scores(A) == {0: 0.0, 1: 0.1, 2: 0.2, 4: 0.4}
    # 3 is missing, so only 0..2 are contiguous.
    assert ledger.complete_length(A) == 3
    assert [i in ledger.scores(A) for i in (4, 3, 0, 99, -1)] == [True, False, True, False, False]
    assert ledger.scores(B) == {}
    assert ledger.complete_length(B) == 0
    assert ledger.fact_count == 4


def test_replay_reports_unknown_config_and_missing_samples() -> None:
    """Asking replay for what was never recorded names the config and the missing samples."""
    ledger = Ledger("rag.jsonl")
    ledger.add(A, [0, 1, 2], [1.0, 0.0, 1.0])
    replay = ReplayEvaluator(ledger)
    with pytest.raises(EvaluationError, match=r"rag\.jsonl has no scores for configuration.*large"):
        replay.evaluate(B, [0])
    with pytest.raises(EvaluationError) as info:
        replay.evaluate(A, [1, 3, 2, 7])
    message = str(info.value)
    assert "sample(s) 3, 7 of configuration" in message
    assert '"retriever_k": 5' in message
    assert "samples 0..2 are all recorded" in message


def test_conflicting_facts_are_rejected_with_both_scores(tmp_path: Path) -> None:
    """The same (config, index) with two scores is an error naming the line and the sample."""
    path = _write(
        tmp_path / "rag.jsonl",
        json.dumps({"config": A, "scores": [0.5, 0.7]}),
        json.dumps({"config": A, "samples": [1], "scores": [0.2]}),
    )
    with pytest.raises(LedgerError) as info:
        read_ledger(path)
    message = str(info.value)
    assert message.startswith(f"{path} line 2: ")
    assert "sample 1 " in message
    assert "0.2" in message
    assert "0.7" in message


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ('{"config": {"k": 1}, "scores": [0.5,', "not valid JSON"),
        ('[{"config": {}}]', "expected a JSON object, got a list"),
        ('{"scores": [0.5]}', '"config" is missing'),
        ('{"config": [1, 2], "scores": [0.5]}', '"config" is a list, not an object'),
        ('{"config": {"k": [1]}, "scores": [0.5]}', '"config" value of "k" is a list'),
        ('{"config": {"k": null}, "scores": [0.5]}', '"config" value of "k" is null'),
        ('{"config": {"k": NaN}, "scores": [0.5]}', '"config" value of "k" is nan'),
        ('{"config": {"k": 1}}', '"scores" is missing'),
        ('{"config": {"k": 1}, "scores": "0.5"}', '"scores" is a string, not a list'),
        (
            '{"config": {"k": 1}, "scores": [0.5, "x"]}',
            '"scores" has a non-numeric value "x"; every score must be a number in [0, 1]',
        ),
        ('{"config": {"k": 1}, "scores": [true]}', '"scores" has a non-numeric value true'),
        ('{"config": {"k": 1}, "scores": [0.5, 1.5]}', '"scores" has 1.5 at position 1'),
        ('{"config": {"k": 1}, "scores": [-0.1]}', '"scores" has -0.1 at position 0'),
        ('{"config": {"k": 1}, "scores": [0.5, NaN]}', '"scores" has NaN at position 1'),
        ('{"config": {"k": 1}, "samples": 3, "scores": [0.5]}', '"samples" is a number'),
        (
            '{"config": {"k": 1}, "samples": [0, 1], "scores": [0.5]}',
            '"samples" has 2 indices but "scores" has 1 values',
        ),
        ('{"config": {"k": 1}, "samples": [-1], "scores": [0.5]}', "negative index -1"),
        ('{"config": {"k": 1}, "samples": [1.5], "scores": [0.5]}', "non-integer value 1.5"),
        ('{"config": {"k": 1}, "samples": [2, 2], "scores": [0.5, 0.5]}', "lists index 2 twice"),
    ],
)
def test_each_invalid_line_names_file_line_and_field(
    tmp_path: Path, line: str, expected: str
) -> None:
    """A bad line (not the last, so never mistaken for a torn write) fails with a one-line fix."""
    good = json.dumps({"config": {"k": 0}, "scores": [1.0]})
    path = _write(tmp_path / "rag.jsonl", good, "", line, good)
    with pytest.raises(LedgerError) as info:
        read_ledger(path)
    message = str(info.value)
    assert message.startswith(f"{path} line 3: ")
    assert expected in message
    assert "\n" not in message
    # Every message tells the user what a valid value looks like.
    assert ";" in message


def test_invalid_final_line_with_newline_is_an_error_not_a_torn_write(tmp_path: Path) -> None:
    """Only a final line WITHOUT its newline can be a torn write; with one it is bad data."""
    path = _write(tmp_path / "rag.jsonl", json.dumps({"config": A, "scores": [1]}), '{"config":')
    with pytest.raises(LedgerError, match="line 2: not valid JSON"):
        read_ledger(path)


def test_torn_final_line_is_refused_unless_allowed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A cut-short last line is an error naming it; allowed, only its own batch is lost."""
    path = tmp_path / "ckpt.jsonl"
    path.write_text(
        json.dumps({"config": A, "samples": [0], "scores": [1.0]})
        + "\n"
        + '{"config": {"retriever_k": 10, "model": "lar'
    )
    with pytest.raises(TruncatedLineError, match=r"ckpt\.jsonl line 2: the last line is cut short"):
        read_ledger(path)
    with caplog.at_level(logging.WARNING, logger="compass.evaluators.ledger"):
        ledger = read_ledger(path, allow_truncated=True)
    assert ledger.configs() == [A]
    assert ledger.scores(A) == {0: 1.0}
    assert any(
        "line 2" in r.getMessage() and "incomplete" in r.getMessage() for r in caplog.records
    )


def test_torn_multibyte_character_is_a_torn_write(tmp_path: Path) -> None:
    """A write cut inside a UTF-8 character is still just a torn final line."""
    path = tmp_path / "ckpt.jsonl"
    good = json.dumps({"config": A, "scores": [1.0]}, ensure_ascii=False) + "\n"
    torn = json.dumps({"config": {"model": "é"}, "scores": [1.0]}, ensure_ascii=False)
    cut = torn.encode("utf-8")[: torn.encode("utf-8").index("é".encode()) + 1]
    path.write_bytes(good.encode("utf-8") + cut)
    assert read_ledger(path, allow_truncated=True).configs() == [A]


def test_final_valid_line_without_newline_is_kept(tmp_path: Path) -> None:
    """A hand-written file may omit the last newline; its last line is still data."""
    path = tmp_path / "rag.jsonl"
    path.write_text(json.dumps({"config": A, "scores": [0.25]}))
    assert read_ledger(path).scores(A) == {0: 0.25}


def test_missing_file_names_the_path(tmp_path: Path) -> None:
    """A wrong path is a LedgerError, not a traceback."""
    with pytest.raises(LedgerError, match=r"nope\.jsonl: no such file"):
        read_ledger(tmp_path / "nope.jsonl")


def test_add_rejects_conflict_without_changing_the_ledger() -> None:
    """A conflicting batch is refused whole: none of its facts are kept."""
    ledger = Ledger()
    ledger.add(A, [0, 1], [1.0, 0.0])
    with pytest.raises(LedgerError, match="sample 1 "):
        ledger.add(A, [2, 1], [0.5, 1.0])
    assert ledger.scores(A) == {0: 1.0, 1: 0.0}
    assert ledger.fact_count == 2


def _python_lines_run(call: Callable[[], object]) -> int:
    """How many Python lines call() executes, in every frame it enters: its work, counted."""
    count = 0

    def trace(frame: FrameType, event: str, arg: object) -> Any:
        nonlocal count
        count += 1
        return trace

    gc.disable()  # a collection's finalizers would add lines of their own
    sys.settrace(trace)
    try:
        call()
    finally:
        sys.settrace(None)
        gc.enable()
    return count


def test_lookup_work_does_not_grow_with_the_batch_or_the_ledger() -> None:
    """A batch lookup (a search makes ~100k) runs the same Python whatever the sizes."""
    # One probe and one fancy-index: as many lines for 1 sample of a 1-configuration ledger as
    # for 50 of a 200 x 1000 one. Counted, not timed, so a busy machine cannot fail it; a loop
    # over the samples or the configurations shows as extra lines.
    small = Ledger()
    small.add({"k": 0}, [0], [0.5])
    large = Ledger()
    configs: list[dict[str, ParamValue]] = [{"k": k} for k in range(200)]
    for config in configs:
        large.add(config, range(1000), [0.5] * 1000)
    batch = list(range(100, 150))
    # Once each first, so that lazy imports and caches are not counted.
    assert small.lookup({"k": 0}, [0]).tolist() == [0.5]
    assert large.lookup(configs[137], batch).tolist() == [0.5] * 50
    one = _python_lines_run(lambda: small.lookup({"k": 0}, [0]))
    many = _python_lines_run(lambda: large.lookup(configs[137], batch))
    assert many == one, f"{many} lines for 50 samples of 200 configurations, {one} for 1 of 1"


def test_a_ledger_in_memory_parses_like_its_file_and_errors_name_its_source(
    tmp_path: Path,
) -> None:
    """parse_ledger (a ConfigMap key) and read_ledger (a file) agree; errors name the source."""
    text = '{"config": {"k": 1}, "scores": [1, 0, 1]}\n{"config": {"k": 2}, "scores": [0, 0]}\n'
    path = tmp_path / "l.jsonl"
    path.write_text(text, encoding="utf-8")
    from_file, in_memory = read_ledger(path), parse_ledger(text, "ConfigMap rag key ledger.jsonl")
    for config in ({"k": 1}, {"k": 2}):
        assert in_memory.complete_length(config) == from_file.complete_length(config)
    with pytest.raises(
        LedgerError, match=r"^ConfigMap rag key ledger\.jsonl line 1: not valid JSON"
    ):
        parse_ledger("{oops\n" + text, "ConfigMap rag key ledger.jsonl")
