"""A pydantic validation error as the one field and message a condition or a CLI line names."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from pydantic import ValidationError

# A model validator names the field inside its own object ("metrics.url: ...", "evaluation.
# budgets: ..."), since pydantic locates its error at the object.
_NAMED = re.compile(r"^([A-Za-z][\w.]*(?:\[\d+\])?): (.*)$")


def first_error(error: ValidationError) -> tuple[list[int | str], str]:
    """The first error's location and message, a model validator's own field name moved from
    the message into the location, a union's errors (one per member) made one."""
    errors = error.errors()
    first = errors[0]
    location, message = list(first["loc"]), str(first["msg"]).removeprefix("Value error, ")
    members = _union_members(errors)
    if members:
        location = location[:-1]
        wanted = [m.removeprefix("Input should be ") for m in members]
        message = "Input should be " + " or ".join(dict.fromkeys(wanted))
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


def _union_members(errors: Sequence[Any]) -> list[str]:
    """The messages of the first error's union, when it is one: pydantic reports a value that
    fits no member of ``str | int | float | bool`` once per member, each located at the member's
    tag (``...values[0].str``, ``...values[0].int``), which is no field of the spec."""
    first = errors[0]
    *parent, tag = first["loc"] or ("",)
    same = [e for e in errors if list(e["loc"][:-1]) == parent and len(e["loc"]) == len(parent) + 1]
    tags = {e["loc"][-1] for e in same}
    if len(same) < 2 or not isinstance(tag, str) or not tags <= _MEMBER_TAGS:
        return []
    return [str(e["msg"]) for e in same]


# The tags pydantic gives the members of the unions the CRDs use (scalar values of a space or a
# configuration).
_MEMBER_TAGS = {"str", "int", "float", "bool"}
