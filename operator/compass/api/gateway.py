"""The actuators a ParetoPolicy can act through, and the gateway's two objects: an llm-d
InferenceModelRewrite whose one rule's target weights carry the policy's mix (llm-d.ai/v1alpha2),
or a Gateway API HTTPRoute whose backendRef weights split it across InferencePools."""

from __future__ import annotations

from enum import StrEnum

from pydantic import Field

from compass.api.meta import CamelModel, DnsSubdomain, ShortText

# llm-d's InferenceModelRewrite (the endpoint picker reads it and draws a target per request).
REWRITE_GROUP = "llm-d.ai"
REWRITE_VERSION = "v1alpha2"
REWRITE_KIND = "InferenceModelRewrite"
REWRITE_PLURAL = "inferencemodelrewrites"
# The front configuration's parameter whose value names each member's model, by default.
DEFAULT_MODEL_PARAMETER = "model"
# The Gateway API's HTTPRoute (standard channel): its backendRefs' weights split across pools.
HTTPROUTE_GROUP = "gateway.networking.k8s.io"
HTTPROUTE_VERSION = "v1"
HTTPROUTE_KIND = "HTTPRoute"
HTTPROUTE_PLURAL = "httproutes"
# The backends it weights: the inference extension's InferencePools, one per front member.
POOL_GROUP = "inference.networking.k8s.io"
POOL_KIND = "InferencePool"
# The front configuration's parameter whose value names each member's pool, by default.
DEFAULT_POOL_PARAMETER = "pool"


class ActuatorType(StrEnum):
    """What the policy's decisions are written to."""

    # The Triton routers' control model (switches, admission and binding tables).
    TRITON = "triton"
    # An llm-d InferenceModelRewrite's target weights (the endpoint picker draws per request).
    INFERENCE_MODEL_REWRITE = "inferenceModelRewrite"
    # A Gateway API HTTPRoute's backendRef weights across InferencePools (one per member).
    HTTP_ROUTE = "httpRoute"


class PoolReference(CamelModel):
    """The InferencePool the rewrite applies to (InferenceModelRewrite spec.poolRef)."""

    name: DnsSubdomain = Field(
        description="The InferencePool's name, in the policy's namespace.",
    )
    group: ShortText | None = Field(
        default=None,
        description="The pool's API group (unset: llm-d's default, llm-d.ai; the Gateway API "
        "inference extension's pools are inference.networking.k8s.io).",
    )


class ModelRewriteTarget(CamelModel):
    """The InferenceModelRewrite the policy writes: one rule matching the clients' model name,
    whose targets are the front members the policy's mix serves, weighted by their shares."""

    name: DnsSubdomain = Field(
        description="The InferenceModelRewrite's name, in the policy's namespace (created if "
        "missing; left in place, with its last weights, when the policy is deleted).",
    )
    pool_ref: PoolReference = Field(description="The InferencePool it applies to.")
    model: ShortText = Field(
        min_length=1,
        description="The model name clients send (the rule's match); each request's model is "
        "rewritten to one front member's, drawn by weight.",
    )
    parameter: ShortText = Field(
        default=DEFAULT_MODEL_PARAMETER,
        min_length=1,
        description="The front configurations' parameter whose value is the model served "
        "(the target's modelRewrite): every front entry sets it, to a different model.",
    )


class HttpRouteTarget(CamelModel):
    """The HTTPRoute the policy writes: its rules, one rule whose backendRefs are the
    InferencePools of the front members its mix serves, weighted by their shares."""

    name: DnsSubdomain = Field(
        description="The HTTPRoute's name, in the policy's namespace. The policy owns its "
        "spec.rules (one rule, no matches: every request of the route) and nothing else: give "
        "the route its parentRefs yourself. Left in place, with its last weights, when the "
        "policy is deleted.",
    )
    parameter: ShortText = Field(
        default=DEFAULT_POOL_PARAMETER,
        min_length=1,
        description="The front configurations' parameter whose value is the InferencePool "
        "serving that member: every front entry sets it, to a different pool.",
    )
    pool_group: ShortText = Field(
        default=POOL_GROUP,
        min_length=1,
        description="The pools' API group (inference.networking.k8s.io; llm-d's own is llm-d.ai).",
    )
