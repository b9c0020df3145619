"""A pydantic validation error as the one field and message a condition or a CLI line names."""

from __future__ import annotations

import re
from collections.abc import Sequence

from pydantic import ValidationError

# A model validator names the field inside its own object ("metrics.url: ...", "evaluation.
# budgets: ..."), since pydantic locates its error at the object.
_NAMED = re.compile(r"^([A-Za-z][\w.]*(?:\[\d+\])?): (.*)$")


def first_error(error: ValidationError) -> tuple[list[int | str], str]:
    """The first error's location and message, a model validator's own field name moved from
    the message into the location."""
    first = error.errors()[0]
    location, message = list(first["loc"]), str(first["msg"]).removeprefix("Value error, ")
    named = _NAMED.match(message)
    if named and location and named.group(1).split(".")[0] == location[-1]:
        location, message = [*location[:-1], *named.group(1).split(".")], named.group(2)
    return location, message


def field_path(location: Sequence[int | str], root: str = "") -> str:
    """A location as a spec path: front[0].latencyP95Ms, or spec.evaluation.budgets."""
    path = root
    for part in location:
        path += f"[{part}]" if isinstance(part, int) else f".{part}" if path else str(part)
    return path
