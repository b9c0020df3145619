"""compass.api.conditions: the one way every controller sets and finds its conditions."""

from __future__ import annotations

from compass.api.compoundworkflow import WorkflowConditionType
from compass.api.conditions import MESSAGE_CHARS, Condition
from compass.controllers.conditions import (
    find_condition,
    one_line,
    parse_conditions,
    set_condition,
    set_conditions,
)

NOW = "2026-01-01T00:00:00Z"
LATER = "2026-01-01T00:01:00Z"


def _c(type_: str, status: str, reason: str = "R", **extra: object) -> Condition:
    return Condition.model_validate({"type": type_, "status": status, "reason": reason, **extra})


def test_transition_time_moves_only_when_the_status_changes() -> None:
    first = set_condition([], _c("Ready", "False", "Planning", observedGeneration=1), NOW)
    same = set_condition(first, _c("Ready", "False", "Other", observedGeneration=2), LATER)
    flipped = set_condition(same, _c("Ready", "True", "Ready"), LATER)
    assert first[0].last_transition_time == NOW
    assert (same[0].last_transition_time, same[0].reason) == (NOW, "Other")
    assert same[0].observed_generation == 2
    assert flipped[0].last_transition_time == LATER
    assert len(flipped) == 1


def test_the_new_conditions_own_transition_time_is_ignored() -> None:
    [stamped] = set_condition(
        [], _c("Ready", "True", lastTransitionTime="1999-01-01T00:00:00Z"), NOW
    )
    assert stamped.last_transition_time == NOW


def test_an_unchanged_status_without_a_time_gets_one() -> None:
    [stamped] = set_condition([_c("Ready", "True")], _c("Ready", "True"), NOW)
    assert stamped.last_transition_time == NOW


def test_others_keep_their_place_and_a_new_type_goes_last() -> None:
    start = [_c("A", "True"), _c("B", "False"), _c("C", "True")]
    updated = set_conditions(start, [_c("B", "True"), _c("D", "Unknown")], NOW)
    assert [c.type for c in updated] == ["A", "B", "C", "D"]
    assert updated[0] is start[0]
    assert updated[2] is start[2]


def test_duplicates_of_a_type_collapse_into_the_one_set() -> None:
    start = [_c("A", "True"), _c("B", "True", "Old"), _c("B", "True", "Older"), _c("C", "True")]
    updated = set_condition(start, _c("B", "True", "New"), NOW)
    assert [(c.type, c.reason) for c in updated] == [("A", "R"), ("B", "New"), ("C", "R")]


def test_find_condition() -> None:
    conditions = [_c("A", "True"), _c("B", "False")]
    assert find_condition(conditions, "B") is conditions[1]
    assert find_condition(conditions, "Z") is None


def test_find_condition_takes_a_condition_type_enum() -> None:
    conditions = [_c("SpecValid", "True"), _c("Profiled", "False")]
    assert find_condition(conditions, WorkflowConditionType.PROFILED) is conditions[1]


def test_one_line_collapses_whitespace_and_bounds_the_length() -> None:
    assert one_line("  a\n\tb   c \r\n") == "a b c"
    assert one_line("") == ""
    long = one_line("word " * 1000)
    assert len(long) == MESSAGE_CHARS
    assert long.startswith("word word")


def test_parse_reads_the_wire_format_and_skips_what_is_no_condition() -> None:
    raw = [
        {"type": "Ready", "status": "True", "reason": "Serving", "lastTransitionTime": NOW},
        {"type": "Broken"},
        {"type": "Odd", "status": "Maybe", "reason": "X"},
    ]
    [ready] = parse_conditions(raw)
    assert (ready.type, ready.last_transition_time, ready.message) == ("Ready", NOW, "")
