"""The one shape of an input error: the field, what is wrong with it, and the fix."""

from __future__ import annotations


class FieldError(ValueError):
    """One line, `<field>: <what is wrong>; <the fix>`, with each part kept for the caller."""

    def __init__(self, field: str, what: str, fix: str) -> None:
        super().__init__(f"{field}: {what}; {fix}")
        self.field, self.what, self.fix = field, what, fix

    def __reduce__(self) -> tuple[type[FieldError], tuple[str, str, str]]:
        # Raised in a worker process (the benches'), it must reach the parent whole, not as a
        # TypeError from unpickling an exception whose __init__ takes three arguments.
        return type(self), (self.field, self.what, self.fix)
