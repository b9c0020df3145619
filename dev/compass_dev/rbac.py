"""What the operator may do through the Kubernetes API: the rules its Helm chart grants, which the
tests check the chart against (a handler that needs a new verb adds it here and in the chart)."""

from __future__ import annotations

from dataclasses import dataclass

from compass.api.meta import GROUP, POLICY_PLURAL, WORKFLOW_PLURAL


@dataclass(frozen=True)
class Rule:
    """One RBAC PolicyRule: these verbs on these resources of one API group ("" is core)."""

    api_group: str
    resources: tuple[str, ...]
    verbs: tuple[str, ...]

    def permissions(self) -> set[tuple[str, str, str]]:
        """The (api group, resource[/subresource], verb) triples the rule grants."""
        return {(self.api_group, r, v) for r in self.resources for v in self.verbs}


# In every namespace the operator watches. The Jobs' Role it creates grants only configmaps get
# and patch, which it holds itself: so no `escalate` or `bind`.
OPERATOR_RULES: tuple[Rule, ...] = (
    Rule(GROUP, (WORKFLOW_PLURAL,), ("get", "list", "watch", "patch")),
    Rule(
        GROUP,
        (POLICY_PLURAL,),
        # The generated policy is server-side applied (a patch; create when new), never replaced.
        ("get", "list", "watch", "patch", "create", "delete"),
    ),
    Rule(
        GROUP,
        (f"{WORKFLOW_PLURAL}/status", f"{POLICY_PLURAL}/status"),
        ("get", "patch", "update"),
    ),
    Rule("batch", ("jobs",), ("create", "get", "list", "watch", "delete")),
    Rule("", ("configmaps",), ("create", "get", "list", "watch", "patch", "delete")),
    Rule("", ("pods",), ("get", "list", "watch")),
    # The Triton pods a ParetoPolicy switches: the EndpointSlices of its routing.service.
    Rule("discovery.k8s.io", ("endpointslices",), ("get", "list", "watch")),
    Rule("", ("events",), ("create", "patch")),
    Rule("", ("serviceaccounts",), ("create", "get")),
    Rule("rbac.authorization.k8s.io", ("roles", "rolebindings"), ("create", "get")),
)

# Chart value metricsAuthentication.readSecrets (default true): get the Secret a policy's
# spec.metrics.authentication.secretRef names; never list or watch (no enumerating the others).
SECRET_RULES: tuple[Rule, ...] = (Rule("", ("secrets",), ("get",)),)

# Chart value actuators.inferenceModelRewrite (default false): the weights are server-side
# applied (a patch, which creates a missing rewrite) and read back (get).
MODEL_REWRITE_RULES: tuple[Rule, ...] = (
    Rule("llm-d.ai", ("inferencemodelrewrites",), ("get", "create", "patch")),
)
# Chart value actuators.httpRoute (default false): the same for routing.actuator httpRoute, on
# the Gateway API's HTTPRoutes (the policy owns their rules' backendRef weights).
HTTP_ROUTE_RULES: tuple[Rule, ...] = (
    Rule("gateway.networking.k8s.io", ("httproutes",), ("get", "create", "patch")),
)

# Cluster-scoped and read-only (chart value rbac.discovery): kopf watches CRDs to notice
# resources created after it starts, and lists Namespaces to resolve its namespace patterns.
DISCOVERY_RULES: tuple[Rule, ...] = (
    Rule("apiextensions.k8s.io", ("customresourcedefinitions",), ("get", "list", "watch")),
    Rule("", ("namespaces",), ("get", "list", "watch")),
)


# kopf's peering (chart value peering.enabled), as kopf uses the objects: list and watch them,
# and patch its keep-alive into them; the chart creates them. Cluster mode: ClusterKopfPeering.
CLUSTER_PEERING_RULES: tuple[Rule, ...] = (
    Rule("kopf.dev", ("clusterkopfpeerings",), ("list", "watch", "patch")),
)
NAMESPACED_PEERING_RULES: tuple[Rule, ...] = (
    Rule("kopf.dev", ("kopfpeerings",), ("list", "watch", "patch")),
)

# The chart's post-delete hook (`compass operator release-finalizers`), where the operator
# acted; and list pods in the release's namespace, to wait for the operator's to go first.
RELEASE_RULES: tuple[Rule, ...] = (
    Rule(GROUP, (WORKFLOW_PLURAL, POLICY_PLURAL), ("get", "list", "patch")),
)
RELEASE_POD_RULES: tuple[Rule, ...] = (Rule("", ("pods",), ("list",)),)


def operator_rules(
    *,
    clusterwide: bool,
    peering: bool,
    read_secrets: bool = True,
    model_rewrites: bool = False,
    http_routes: bool = False,
) -> tuple[Rule, ...]:
    """The rules of the operator's ClusterRole (cluster mode) or of each Role (namespaced)."""
    rules = OPERATOR_RULES + (SECRET_RULES if read_secrets else ())
    rules += MODEL_REWRITE_RULES if model_rewrites else ()
    rules += HTTP_ROUTE_RULES if http_routes else ()
    if not peering:
        return rules
    return rules + (CLUSTER_PEERING_RULES if clusterwide else NAMESPACED_PEERING_RULES)


def permissions(rules: tuple[Rule, ...]) -> set[tuple[str, str, str]]:
    """Every (api group, resource, verb) the rules grant."""
    return set().union(*(rule.permissions() for rule in rules))
