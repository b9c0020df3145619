"""What the operator may do through the Kubernetes API: the rules its Helm chart grants.

The chart (charts/compass-operator/templates/_helpers.tpl) writes these rules as YAML; the tests
render it and check it grants exactly these (tests/repo/test_chart_render.py), then ask a real
API server what the installed ServiceAccount may and may not do (tests/k8s/test_chart.py). A
handler that needs a new verb adds it here and in the chart.
"""

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


# In every namespace the operator watches (a ClusterRole in cluster mode, a Role per watched
# namespace in namespaced mode). The Jobs' Role the operator creates grants configmaps get and
# patch only, which the operator holds itself: so no `escalate` or `bind`.
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

# Chart value metricsAuthentication.readSecrets (default true): get, by name, the Secret a
# ParetoPolicy's spec.metrics.authentication.secretRef names in its own namespace. Never list or
# watch: the operator reads only the Secrets policies name, and cannot enumerate the others.
# Cluster mode grants it in every namespace (names vary, so no resourceNames).
SECRET_RULES: tuple[Rule, ...] = (Rule("", ("secrets",), ("get",)),)

# Chart value actuators.inferenceModelRewrite (default false): the llm-d gateway as a policy's
# actuator (routing.actuator inferenceModelRewrite). Its weights are server-side applied: a
# patch, which creates the rewrite where it is missing; get reads them back.
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


# kopf's peering (chart value peering.enabled), what kopf itself does with the objects: list and
# watch them (the peering observer) and merge-patch its own keep-alive into their status (the
# CRDs have no status subresource, so the object itself). It never creates, gets or deletes
# them: the chart creates them (`compass operator` lists them by name at start, to fail
# clearly where one is missing). Cluster mode uses the cluster-scoped ClusterKopfPeering (in the
# ClusterRole), namespaced mode a KopfPeering in each watched namespace (in each Role).
CLUSTER_PEERING_RULES: tuple[Rule, ...] = (
    Rule("kopf.dev", ("clusterkopfpeerings",), ("list", "watch", "patch")),
)
NAMESPACED_PEERING_RULES: tuple[Rule, ...] = (
    Rule("kopf.dev", ("kopfpeerings",), ("list", "watch", "patch")),
)

# The chart's post-delete hook (`compass operator release-finalizers`, chart value
# uninstall.releaseFinalizers), its own ServiceAccount, where the operator acted: find the
# workflows and policies and take kopf's finalizer off them (a JSON patch; get to read one again
# after a lost race). And, in the release's namespace, list pods: it waits for the operator's
# to go first, since a live operator would put the finalizers back.
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
