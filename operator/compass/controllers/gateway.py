"""The gateway as an actuator: a mix as InferenceModelRewrite or HTTPRoute weights, never forced."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from kubernetes import client

from compass.api.gateway import (
    HTTPROUTE_GROUP,
    HTTPROUTE_KIND,
    HTTPROUTE_PLURAL,
    HTTPROUTE_VERSION,
    POOL_KIND,
    REWRITE_GROUP,
    REWRITE_KIND,
    REWRITE_PLURAL,
    REWRITE_VERSION,
    HttpRouteTarget,
    ModelRewriteTarget,
)
from compass.controllers import kubeapi
from compass.dataplane.triton import RoutingError, SwitchReport, parse_routing_key, routing_key
from compass.domain.evaluation import Config
from compass.domain.planner import Plan
from compass.domain.space import config_key

# Who owns the weights: the operator's own manager for them, apart from the one that writes its
# other objects, so that `kubectl get --show-managed-fields` says plainly who set them.
WEIGHTS_FIELD_MANAGER = "compass-operator-weights"
# The weights of a mix sum to this (the CRD's weights are integers, at least 1 each).
WEIGHT_TOTAL = 1000


class WeightsConflictError(RoutingError):
    """Another field manager holds the rewrite's rules at other values: nothing was written."""


def target_weights(
    config: Config, blend: Config | None, weight: float, parameter: str
) -> tuple[tuple[str, int], ...]:
    """The rewrite's (model, weight) targets for a mix on the routers' grid (the CRD: no 0)."""
    base, blended, share = parse_routing_key(routing_key(config, blend, weight))
    if blended is None:
        served = blend if blend is not None and config_key(blend) == base else config
        return ((str(served[parameter]), WEIGHT_TOTAL),)
    assert blend is not None
    blend_weight = min(max(round(share * WEIGHT_TOTAL), 1), WEIGHT_TOTAL - 1)
    return (
        (str(config[parameter]), WEIGHT_TOTAL - blend_weight),
        (str(blend[parameter]), blend_weight),
    )


def build_model_rewrite(
    namespace: str, target: ModelRewriteTarget, weights: Sequence[tuple[str, int]]
) -> dict[str, Any]:
    """The InferenceModelRewrite the policy applies: one rule for the clients' model, weighted."""
    pool: dict[str, str] = {"name": target.pool_ref.name}
    if target.pool_ref.group is not None:
        pool["group"] = target.pool_ref.group
    return {
        "apiVersion": f"{REWRITE_GROUP}/{REWRITE_VERSION}",
        "kind": REWRITE_KIND,
        "metadata": {"name": target.name, "namespace": namespace},
        "spec": {
            "poolRef": pool,
            "rules": [
                {
                    "matches": [{"model": {"type": "Exact", "value": target.model}}],
                    "targets": [{"modelRewrite": m, "weight": w} for m, w in weights],
                }
            ],
        },
    }


def build_http_route(
    namespace: str, target: HttpRouteTarget, weights: Sequence[tuple[str, int]]
) -> dict[str, Any]:
    """The HTTPRoute's rules the policy applies: one, for every request, over weighted pools."""
    backends = [
        {"group": target.pool_group, "kind": POOL_KIND, "name": pool, "weight": weight}
        for pool, weight in weights
    ]
    return {
        "apiVersion": f"{HTTPROUTE_GROUP}/{HTTPROUTE_VERSION}",
        "kind": HTTPROUTE_KIND,
        "metadata": {"name": target.name, "namespace": namespace},
        "spec": {"rules": [{"backendRefs": backends}]},
    }


def applied_backend_weights(route: Mapping[str, Any], pool_group: str) -> dict[str, float] | None:
    """The pool weights of the route's first rule with pool backendRefs (unweighted: 1), or None."""
    spec = route.get("spec")
    rules = spec.get("rules") if isinstance(spec, Mapping) else None
    for rule in rules if isinstance(rules, list) else []:
        refs = rule.get("backendRefs") if isinstance(rule, Mapping) else None
        pools = [
            ref
            for ref in (refs if isinstance(refs, list) else [])
            if isinstance(ref, Mapping)
            and ref.get("kind") == POOL_KIND
            and ref.get("group") == pool_group
            and isinstance(ref.get("name"), str)
        ]
        if not pools:
            continue
        weights: dict[str, float] = {}
        for ref in pools:
            weight = ref.get("weight", 1)
            share = float(weight) if isinstance(weight, int | float) else 0.0
            weights[ref["name"]] = weights.get(ref["name"], 0.0) + share
        # Other backends in the same rule take their share too: the weights then serve no mix.
        others = len(refs) - len(pools) if isinstance(refs, list) else 0
        if others:
            weights[f"{others} other backend(s)"] = 1.0
        return weights
    return None


def applied_weights(rewrite: Mapping[str, Any], model: str) -> dict[str, float] | None:
    """The weights of the first rule matching ``model`` (unweighted: 1); None if no rule matches."""
    spec = rewrite.get("spec")
    rules = spec.get("rules") if isinstance(spec, Mapping) else None
    for rule in rules if isinstance(rules, list) else []:
        if not isinstance(rule, Mapping):
            continue
        matches = rule.get("matches") or []
        values = [(m.get("model") or {}).get("value") for m in matches if isinstance(m, Mapping)]
        if model not in values:
            continue
        weights: dict[str, float] = {}
        for target in rule.get("targets") or []:
            if isinstance(target, Mapping) and isinstance(target.get("modelRewrite"), str):
                weight = target.get("weight", 1)
                share = float(weight) if isinstance(weight, int | float) else 0.0
                name = target["modelRewrite"]
                weights[name] = weights.get(name, 0.0) + share
        return weights
    return None


def weights_routing(weights: Mapping[str, float], plan: Plan, parameter: str, where: str) -> str:
    """The routing key the weights serve (a mix of two at most), else a description on no front."""
    members = {
        str(t.profile.config.get(parameter)): (i, t.profile.config)
        for i, t in enumerate(plan.thresholds)
    }
    served = sorted((members[m], w) for m, w in weights.items() if w > 0 and m in members)
    total = sum(weights.values())
    if not served or len(served) > 2 or total <= 0 or sum(w for _, w in served) != total:
        shown = ", ".join(f"{m}={w:g}" for m, w in sorted(weights.items())) or "no targets"
        return f"{where} weights {shown}"
    if len(served) == 1:
        return config_key(served[0][0][1])
    (_, faster), _ = served[0]
    (_, other), share = served[1]
    return routing_key(faster, other, share / total)


class ModelRewriteActuator:
    """One policy's InferenceModelRewrite or HTTPRoute: read back each tick, applied on a change."""

    def __init__(
        self,
        api: client.ApiClient,
        namespace: str,
        target: ModelRewriteTarget | HttpRouteTarget,
        plan: Plan,
    ) -> None:
        self.custom = client.CustomObjectsApi(api)
        self.namespace, self.target, self.plan = namespace, target, plan
        route = isinstance(target, HttpRouteTarget)
        group, version, plural = (
            (HTTPROUTE_GROUP, HTTPROUTE_VERSION, HTTPROUTE_PLURAL)
            if route
            else (REWRITE_GROUP, REWRITE_VERSION, REWRITE_PLURAL)
        )
        # The object as the custom objects API takes it, and as messages name it.
        self.object = (group, version, namespace, plural, target.name)
        self.where = f"{HTTPROUTE_KIND if route else REWRITE_KIND} {namespace}/{target.name}"
        # What the object held at the last read (None: not read since the last apply).
        self.read_key: str | None = None
        # Why the last apply was refused (another field manager's weights), until one succeeds.
        self.conflict: str | None = None

    def active_config(self, expected: str | None = None) -> str:
        """What the object's weights serve now (a routing key); RoutingError if unreadable."""
        del expected  # one object: nothing to outvote
        try:
            found = kubeapi.read(self.custom.get_namespaced_custom_object, *self.object)
        except kubeapi.ERRORS as error:
            raise RoutingError(f"{self.where} unreadable: {kubeapi.describe(error)}") from error
        target = self.target
        if isinstance(target, HttpRouteTarget):
            weights = None if found is None else applied_backend_weights(found, target.pool_group)
            rule = f"has no rule with {target.pool_group} {POOL_KIND} backends"
        else:
            weights = None if found is None else applied_weights(found, target.model)
            rule = f"has no rule for {target.model!r}"
        if weights is None:
            self.read_key = f"{self.where} {'missing' if found is None else rule}"
        else:
            self.read_key = weights_routing(weights, self.plan, self.target.parameter, self.where)
        return self.read_key

    def switch(
        self, config: Config, blend: Config | None = None, weight: float = 0.0
    ) -> SwitchReport:
        """Apply the mix's weights (none sent if the last read showed them); WeightsConflictError,
        kept in ``conflict`` until an apply succeeds, when another manager holds them."""
        wanted = routing_key(config, blend, weight)
        if self.read_key == wanted:
            self.conflict, self.read_key = None, None
            return SwitchReport(wanted, attempts=0, seconds=0.0, changed=False)
        weights = target_weights(config, blend, weight, self.target.parameter)
        target = self.target
        body = (
            build_http_route(self.namespace, target, weights)
            if isinstance(target, HttpRouteTarget)
            else build_model_rewrite(self.namespace, target, weights)
        )
        started = time.perf_counter()
        try:
            kubeapi.apply(
                self.custom.patch_namespaced_custom_object,
                *self.object,
                body=body,
                force=False,
                field_manager=WEIGHTS_FIELD_MANAGER,
            )
        except kubeapi.ConflictError as error:
            self.conflict = (
                f"{self.where}: its weights are held by another field manager "
                f"({kubeapi.answer_message(error) or 'HTTP 409'}); not overwritten: "
                f"left at what they are, where the policy wants {_shown(weights)}; remove "
                "that manager's edit (or its ownership of spec.rules) for the policy to act"
            )
            self.read_key = None
            raise WeightsConflictError(self.conflict) from error
        except kubeapi.ERRORS as error:
            self.read_key = None
            raise RoutingError(f"{self.where} not applied: {kubeapi.describe(error)}") from error
        self.conflict, self.read_key = None, None
        return SwitchReport(wanted, attempts=1, seconds=time.perf_counter() - started)


def _shown(weights: Sequence[tuple[str, int]]) -> str:
    return ", ".join(f"{model}={weight}" for model, weight in weights)
