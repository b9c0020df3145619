"""CEL validation rules that travel with a model into its CRD schema.

A model declares, next to the pydantic validator that checks a cross-field rule, the same rule in
CEL (``model_config = cel_rules(...)``): current API servers enforce it at admission, 1.20 drops
it and the pydantic check reports the same error as a condition. tests/unit/test_crd_rules.py
evaluates every rule with a CEL implementation against the pydantic verdict.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import ConfigDict

VALIDATIONS = "x-kubernetes-validations"


@dataclass(frozen=True)
class CelRule:
    """One x-kubernetes-validations entry; ``self`` is the object of the model that declares it."""

    rule: str
    message: str
    # Where the server reports the error, relative to the object (e.g. ".budgets"); Kubernetes
    # >= 1.28 uses it, older servers report the object's own path.
    field_path: str | None = None
    # FieldValueInvalid (the server's default), FieldValueRequired, FieldValueForbidden or
    # FieldValueDuplicate: the HTTP reason clients see.
    reason: str | None = None

    def as_schema(self) -> dict[str, str]:
        """The rule as the CRD schema spells it."""
        entry = {"rule": self.rule, "message": self.message}
        if self.field_path is not None:
            entry["fieldPath"] = self.field_path
        if self.reason is not None:
            entry["reason"] = self.reason
        return entry


def cel_rules(*rules: CelRule) -> ConfigDict:
    """A model's ``model_config`` whose ``json_schema_extra`` carries these rules."""
    extra: dict[str, Any] = {VALIDATIONS: [rule.as_schema() for rule in rules]}
    return ConfigDict(json_schema_extra=extra)


def strictly_increasing(field: str, max_items: int) -> str:
    """CEL that holds when the list ``self.<field>`` (at most max_items long) strictly increases."""
    # CEL has no index ranges (isSorted() is not in every implementation): a literal list of
    # indices, which max_items bounds to keep the cost estimate low.
    indices = ", ".join(str(i) for i in range(1, max_items))
    items = f"self.{field}"
    return f"[{indices}].all(i, i >= size({items}) || {items}[i - 1] < {items}[i])"
