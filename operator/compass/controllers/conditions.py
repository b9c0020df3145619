"""The one way to update a status's conditions, as apimachinery's meta helpers do for Go."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from compass.api.conditions import MESSAGE_CHARS, Condition


@dataclass(frozen=True)
class Event:
    """A Kubernetes Event on a workflow or policy: posted once, on the transition it reports."""

    type: str  # Normal or Warning
    reason: str
    message: str


def one_line(text: str) -> str:
    """The text with its whitespace collapsed to single spaces, cut to MESSAGE_CHARS."""
    return " ".join(text.split())[:MESSAGE_CHARS]


def find_condition(conditions: Iterable[Condition], type_: str) -> Condition | None:
    """The condition of this type, if set."""
    return next((c for c in conditions if c.type == type_), None)


def set_condition(conditions: Sequence[Condition], new: Condition, now: str) -> list[Condition]:
    """The conditions with ``new`` in its type's place; lastTransitionTime ``now`` on a change."""
    old = find_condition(conditions, new.type)
    unchanged = old is not None and old.status == new.status
    kept = old.last_transition_time if old is not None and unchanged else None
    stamped = new.model_copy(update={"last_transition_time": kept or now})
    merged = [c for c in conditions if c.type != new.type]
    first = next((i for i, c in enumerate(conditions) if c.type == new.type), len(conditions))
    # Nothing of this type comes before its first entry, so the index is the same in `merged`.
    merged.insert(first, stamped)
    return merged


def set_conditions(
    conditions: Sequence[Condition], updates: Iterable[Condition], now: str
) -> list[Condition]:
    """The conditions with each of ``updates`` set in turn (see set_condition)."""
    merged = list(conditions)
    for update in updates:
        merged = set_condition(merged, update, now)
    return merged


def parse_conditions(raw: Iterable[Mapping[str, Any]]) -> list[Condition]:
    """Conditions from a status on the wire (camelCase); an entry that is none is left out."""
    parsed = []
    for entry in raw:
        try:
            parsed.append(Condition.model_validate(entry))
        except ValidationError:
            continue
    return parsed
