"""What a CompoundWorkflow may ask for its Jobs' pods within the chart's limits (jobPods)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation

from kubernetes.utils import parse_quantity

from compass.api.compoundworkflow import CompoundWorkflowSpec
from compass.api.jobpod import JobPod, Toleration
from compass.controllers.workflow_spec import InvalidSpecError

ANY = "*"
REASON = "JobPodNotAllowed"
# Affinities that choose nodes as nodeSelector does: refused while nodeSelector is restricted.
PLACING_AFFINITIES = ("nodeAffinity", "podAffinity")


def quantity(text: str | int) -> Decimal:
    """A Kubernetes quantity's value (500m is 0.5, 2Gi is 2147483648); ValueError if none."""
    try:
        return Decimal(parse_quantity(text))  # type: ignore[no-untyped-call]
    except (ValueError, InvalidOperation) as error:
        raise ValueError(f"{text!r} is not a Kubernetes quantity: {error}") from None


@dataclass(frozen=True)
class JobPodLimits:
    """The settings' limits (default: none): tolerations ``*``, ``KEY`` or ``KEY:EFFECT``; node
    selectors ``*``, ``KEY=*`` or ``KEY=VALUE``; max resources per pod; classes: names or ``*``."""

    tolerations: tuple[str, ...] = (ANY,)
    node_selector: tuple[str, ...] = (ANY,)
    max_resources: Mapping[str, str] = field(default_factory=dict)
    priority_classes: tuple[str, ...] = (ANY,)
    runtime_classes: tuple[str, ...] = (ANY,)

    def toleration_allowed(self, toleration: Toleration) -> bool:
        """Whether a listed entry covers every taint this toleration tolerates."""
        if ANY in self.tolerations:
            return True
        if toleration.key is None:  # operator Exists with no key: every taint
            return False
        if toleration.key in self.tolerations:
            return True
        return toleration.effect is not None and (
            f"{toleration.key}:{toleration.effect}" in self.tolerations
        )

    def node_label_allowed(self, key: str, value: str) -> bool:
        """Whether a listed entry allows this node label."""
        return bool({ANY, f"{key}={ANY}", f"{key}={value}"} & set(self.node_selector))


def _listed(entries: Iterable[str]) -> str:
    return ", ".join(entries) or "none"


def _refuse(field_name: str, what: str, setting: str) -> InvalidSpecError:
    return InvalidSpecError(
        field_name,
        f"{what}; change it to fit, or ask the operator's administrator to widen "
        f"jobPods.{setting} (Helm value)",
        REASON,
    )


def authorize_job_pods(spec: CompoundWorkflowSpec, limits: JobPodLimits) -> None:
    """InvalidSpecError (JobPodNotAllowed) naming the field and the limit a Job's pod passes."""
    for name, section in (("search", spec.search), ("profiling", spec.profiling)):
        _authorize_section(f"spec.{name}", section, limits)


def _authorize_section(path: str, section: JobPod, limits: JobPodLimits) -> None:
    for field_name, named, allowed, setting in (
        ("priorityClassName", section.priority_class_name, limits.priority_classes, "Priority"),
        ("runtimeClassName", section.runtime_class_name, limits.runtime_classes, "Runtime"),
    ):
        if named is not None and ANY not in allowed and named not in allowed:
            raise _refuse(
                f"{path}.{field_name}",
                f"{named} is not a {setting}Class the operator allows Jobs ({_listed(allowed)})",
                f"allowed{setting}Classes",
            )
    for index, toleration in enumerate(section.tolerations):
        if not limits.toleration_allowed(toleration):
            shown = f"{toleration.key}:{toleration.effect or 'any effect'}"
            if toleration.key is None:
                shown = "every taint (no key)"
            raise _refuse(
                f"{path}.tolerations[{index}]",
                f"tolerating {shown} is past the tolerations the operator allows Jobs "
                f"({_listed(limits.tolerations)})",
                "allowedTolerations",
            )
    for key, value in section.node_selector.items():
        if not limits.node_label_allowed(key, value):
            raise _refuse(
                f"{path}.nodeSelector.{key}",
                f"{key}={value} is not a node label the operator allows Jobs "
                f"({_listed(limits.node_selector)})",
                "allowedNodeSelector",
            )
    if ANY not in limits.node_selector:
        for kind in PLACING_AFFINITIES:
            if (section.affinity or {}).get(kind):
                raise _refuse(
                    f"{path}.affinity.{kind}",
                    f"{kind} chooses nodes, and the operator restricts the nodes Jobs may "
                    "ask for (allowedNodeSelector): use nodeSelector with an allowed label",
                    "allowedNodeSelector",
                )
    for kind, values in (
        ("requests", section.resources.requests),
        ("limits", section.resources.limits),
    ):
        for resource, asked in values.items():
            most = limits.max_resources.get(resource)
            if most is not None and quantity(asked) > quantity(most):
                raise _refuse(
                    f"{path}.resources.{kind}[{resource}]",
                    f"{asked} {resource} is over the {most} the operator allows one Job's pod",
                    "maxResources",
                )
