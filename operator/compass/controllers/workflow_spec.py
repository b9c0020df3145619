"""A CompoundWorkflow's spec checked: what its schema cannot say, what the settings refuse."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import ValidationError

from compass.api.compoundworkflow import CompoundWorkflowSpec
from compass.api.errors import field_path, first_error
from compass.controllers.targets import TargetAccess, TargetRefusedError, resolve_host, resolve_url
from compass.domain.space import Space, SpaceError


class InvalidSpecError(ValueError):
    """A spec that can never work (InvalidSpec), or one the settings refuse (TargetNotAllowed)."""

    def __init__(self, field: str, what: str, reason: str = "InvalidSpec") -> None:
        super().__init__(f"{field}: {what}")
        self.field, self.what, self.reason = field, what, reason


def validate_spec(raw: Mapping[str, Any]) -> tuple[CompoundWorkflowSpec, int]:
    """The spec and its space's size, or InvalidSpecError naming the first bad field and the fix:
    what the schema cannot say. The space is counted, never built (~230 MiB at the limit)."""
    spec = parse_spec(raw)
    try:
        size = Space.count(spec.space)
    except SpaceError as error:
        raise InvalidSpecError("spec.space", str(error)) from None
    return spec, size


def parse_spec(raw: Mapping[str, Any]) -> CompoundWorkflowSpec:
    """The spec without enumerating its space; InvalidSpecError naming the field and the fix."""
    try:
        spec = CompoundWorkflowSpec.model_validate(dict(raw))
    except ValidationError as error:
        loc, what = first_error(error)
        constraint = re.match(r"^constraint '(.*?)': (.*)$", what)
        space = raw.get("space")
        listed = space.get("constraints") if isinstance(space, Mapping) else None
        constraints = list(listed) if isinstance(listed, list) else []
        if constraint and constraint.group(1) in constraints:
            index = constraints.index(constraint.group(1))
            field = f"spec.space.constraints[{index}]"
            raise InvalidSpecError(field, constraint.group(0)) from error
        raise InvalidSpecError(field_path(loc, "spec"), what) from error
    return spec


def authorize_workflow_targets(
    spec: CompoundWorkflowSpec, namespace: str, access: TargetAccess
) -> None:
    """InvalidSpecError (TargetNotAllowed) if the settings refuse the Triton or metrics URL."""
    triton = spec.triton
    try:
        if triton.namespace not in (None, namespace) and not access.namespace_allowed(
            triton.namespace, namespace
        ):
            raise TargetRefusedError(
                "triton.namespace",
                f"{triton.namespace} is not the workflow's namespace ({namespace}), and a "
                "workflow may only switch routers in its own",
                "serve the workflow from a Triton of this namespace, or ask the operator's "
                f"administrator to add {triton.namespace} to allowedTargetNamespaces (Helm value)",
            )
        for field, host in (
            ("triton.service", triton.service),
            ("triton.evaluationService", triton.evaluation_service),
        ):
            if host and "." in host:  # a host: NAME.NAMESPACE.svc, or one outside the cluster
                resolve_host(host, field, namespace, access, router=True)
        metrics = spec.serving.metrics
        if metrics is not None and metrics.url:
            resolve_url(metrics.url, "serving.metrics.url", namespace, access)
    except TargetRefusedError as error:
        raise InvalidSpecError(
            f"spec.{error.field}", f"{error.what}; {error.fix}", "TargetNotAllowed"
        ) from error


def image_allowed(image: str, own: str, allowed: Sequence[str]) -> bool:
    """Whether a Job may run this image: the operator's own, one listed, or under a prefix*."""
    return image == own or any(
        image == pattern or (pattern.endswith("*") and image.startswith(pattern[:-1]))
        for pattern in allowed
    )


def authorize_images(spec: CompoundWorkflowSpec, own: str, allowed: Sequence[str]) -> None:
    """InvalidSpecError (ImageNotAllowed) for a Job image the settings refuse: the Jobs' account
    writes their state, so who writes a workflow must not pick the code that runs with it."""
    for name, image in (
        ("search.image", spec.search.image),
        ("profiling.image", spec.profiling.image),
    ):
        if image and not image_allowed(image, own, allowed):
            raise InvalidSpecError(
                f"spec.{name}",
                f"{image} is not an image the operator's settings allow for Jobs (its own, "
                f"{own}, and allowedJobImages); leave {name} out to use the operator's image, or "
                "ask the operator's administrator to add it to allowedJobImages (Helm value)",
                "ImageNotAllowed",
            )
