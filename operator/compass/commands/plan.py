"""`compass plan`: the Pareto front of latency profiles, its thresholds, and the ParetoPolicy
manifest (apiVersion, kind, metadata, spec) to kubectl apply or commit for GitOps."""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from compass.api.binding import BindingMode, BindingSettings, BindingStage
from compass.api.errors import first_error
from compass.api.meta import (
    DEFAULT_ROUTER_MODEL,
    DNS_LABEL_PATTERN,
    DNS_SUBDOMAIN_PATTERN,
    MAX_NAME_LENGTH,
    MAX_NAMESPACE_LENGTH,
)
from compass.api.paretopolicy import (
    DEFAULT_SLACK_BUFFER_MS,
    MAX_FRONT,
    MAX_ROUTER_INSTANCES,
    AdmissionSettings,
    ParetoPolicySpec,
)
from compass.api.routing import RoutingTarget
from compass.commands import plots
from compass.commands.common import (
    add_admission_arguments,
    add_enum_argument,
    admission_degrade_after,
    admission_quantile,
    check_output,
    plan_error,
    read_document,
    save_output,
    write_text,
)
from compass.console import (
    UsageError,
    fail,
    parse_int,
    parse_number,
    plan_table,
    policy_manifest,
    policy_text,
    serving_summary,
)
from compass.conversion import spec_for_plan
from compass.domain.planner import (
    PlanError,
    Slo,
    ThresholdModel,
    pareto_front,
    plan_from_profiles,
)
from compass.domain.profiles import LatencyProfile, ProfileError, parse_profiles
from compass.domain.strategy import Strategy

DEFAULT_POLICY = "paretopolicy.yaml"


def register(commands: Any, summary: str) -> None:
    """Add `compass plan` to the `compass` parser."""
    plan = commands.add_parser(
        "plan",
        help=summary,
        description="Keep the configurations no other beats on both accuracy and tail latency, "
        "order them by mean service time, derive each one's queue-depth (and, with the tail "
        "model, arrival-rate) limits for the SLO, print them, and write them as a ParetoPolicy "
        "manifest to kubectl apply (or commit for GitOps). By default the routers bind each "
        "request to the most accurate member that fits its deadline (per-request binding, "
        "with admission and the lag cap); --stage binds stage by stage, --whole-workflow "
        "switches the whole workflow instead.",
    )
    plan.add_argument(
        "--profiles", required=True, metavar="PROFILES.json", help="`compass profile` output"
    )
    plan.add_argument("--slo-ms", required=True, help="latency target in ms")
    plan.add_argument("--percentile", default="95", help="percentile held to it (default 95)")
    plan.add_argument(
        "--slack-ms",
        default=f"{DEFAULT_SLACK_BUFFER_MS:g}",
        help=f"headroom to switch to a more accurate one (default {DEFAULT_SLACK_BUFFER_MS:g})",
    )
    plan.add_argument(
        "--model",
        choices=[m.value for m in ThresholdModel],
        default=ThresholdModel.TAIL.value,
        help="tail (default: tail of the queued work and M/G/1 rate limits), paper-mean, "
        "erlang-c (M/G/c with --router-instances servers) or measured (each profile's capacity "
        "curve; erlang-c for a profile without one)",
    )
    plan.add_argument(
        "--router-instances",
        default="1",
        help="requests a pod's router serves at once (its instance count; default 1)",
    )
    plan.add_argument(
        "--stage",
        action="append",
        default=None,
        metavar="MODEL[+MODEL...]:PARAM[,PARAM...]",
        help="bind each request stage by stage: a stage's component model (or models, joined "
        "by +) and the parameters the pipeline reads just before calling it, in the order a "
        "request reaches them; repeat per stage (default: none, the whole configuration bound "
        "when a router instance takes the request up)",
    )
    plan.add_argument(
        "--whole-workflow",
        action="store_true",
        help="no per-request binding: the policy switches the whole workflow (for routers that "
        "cannot bind per request), with --strategy",
    )
    add_enum_argument(
        plan,
        "--strategy",
        Strategy.ELASTICO,
        "with --whole-workflow, how the policy moves along the front: elastico (default: switch "
        "between members), split (also serve a share with the next more accurate member) or "
        "predictive (the most accurate mix whose next 10 s forecast keeps the SLO; meant with "
        "--admission)",
    )
    admission = plan.add_mutually_exclusive_group()
    admission.add_argument(
        "--admission",
        action="store_true",
        help="the routers judge each request by its deadline: served as routed if that fits, "
        "else on the fastest member, else refused (retryable); the default with per-request "
        "binding, off with --whole-workflow unless given",
    )
    admission.add_argument(
        "--no-admission",
        action="store_true",
        help="refuse nothing and judge nothing at dispatch (admission.enabled: false)",
    )
    add_admission_arguments(plan, "0.5", where=False)
    plan.add_argument(
        "--no-refuse",
        action="store_true",
        help="with --admission: serve a request that would be late whatever serves it on the "
        "fastest member instead of refusing it (admission.refuse: false)",
    )
    plan.add_argument(
        "--output",
        default=DEFAULT_POLICY,
        metavar="POLICY.yaml",
        help=f"the ParetoPolicy manifest (default {DEFAULT_POLICY})",
    )
    plan.add_argument(
        "--format",
        choices=("yaml", "json"),
        help="the manifest's format (default: json for a .json --output, else yaml)",
    )
    plan.add_argument(
        "--name",
        help="metadata.name of the ParetoPolicy (default: the --output file's name without its "
        "extension, made a valid Kubernetes name)",
    )
    plan.add_argument(
        "--namespace", help="metadata.namespace (default: none, kubectl's current namespace)"
    )
    plan.add_argument(
        "--service",
        metavar="NAME",
        help="routing.service: the Service of the Triton pods the policy switches, in the "
        "policy's namespace (without it the manifest needs a routing section before it serves)",
    )
    plan.add_argument(
        "--router-model",
        help=f"routing.routerModel: the router model's name (default {DEFAULT_ROUTER_MODEL})",
    )
    plan.add_argument("--plot", metavar="FRONT.png", help="draw the front and its thresholds")
    plan.set_defaults(handler=plan_command)


# What each model's arrival-rate limits come from, as the plan's legend says it.
RATE_MODELS = {
    ThresholdModel.TAIL: "M/G/1",
    ThresholdModel.ERLANG_C: "M/G/c, Erlang C",
    ThresholdModel.MEASURED: "the measured curves",
}


# The front is found by comparing profiles pairwise: 10,000 take seconds, a 32 MiB file of
# them (100,000 and more) would take hours. `compass profile` writes one per feasible
# configuration of a search, far fewer.
MAX_PROFILES = 10_000


def load_profiles(path: Path) -> tuple[LatencyProfile, ...]:
    """The profiles file, validated."""
    data = read_document("--profiles", path)
    listed = data.get("profiles") if isinstance(data, dict) else data
    if isinstance(listed, list) and len(listed) > MAX_PROFILES:
        fail(
            f"--profiles {path}",
            f"{len(listed):,} profiles, above the {MAX_PROFILES:,} compass plans over",
            "profile fewer configurations (the feasible ones of a search)",
        )
    try:
        return parse_profiles(data)
    except ProfileError as exc:
        raise UsageError(f"--profiles {path}: {exc}") from None


def check_front_size(path: Path, profiles: tuple[LatencyProfile, ...], percentile: float) -> None:
    """The front must fit in a ParetoPolicy (MAX_FRONT members), checked before planning it."""
    try:
        members = len(pareto_front(profiles, percentile).members)
    except PlanError as exc:
        raise plan_error(exc, f"--profiles {path}") from None
    if members > MAX_FRONT:
        fail(
            f"--profiles {path}",
            f"the Pareto front has {members:,} members, above the {MAX_FRONT:,} a ParetoPolicy "
            "holds",
            "profile fewer configurations, or coarser ones",
        )


# Kubernetes object names: a DNS subdomain (a ParetoPolicy's name) and a DNS label (a namespace).
_SUBDOMAIN = re.compile(DNS_SUBDOMAIN_PATTERN)
_NAMESPACE = re.compile(DNS_LABEL_PATTERN)


def _checked(flag: str, value: str, pattern: re.Pattern[str], fix: str) -> str:
    """The value, or a usage error naming the flag if it is no valid Kubernetes name."""
    limit = MAX_NAME_LENGTH if pattern is _SUBDOMAIN else MAX_NAMESPACE_LENGTH
    if len(value) > limit or not pattern.match(value):
        fail(
            flag,
            f"{value!r} is not a valid Kubernetes name",
            f"use lower case, digits and '-', {fix}",
        )
    return value


def policy_name_of(name: str | None, output: Path) -> str:
    """--name, checked; without it, the --output file's stem as a Kubernetes name."""
    if name is not None:
        return _checked("--name", name, _SUBDOMAIN, "e.g. rag-policy")
    derived = re.sub(r"[^a-z0-9.-]+", "-", output.stem.lower())
    derived = re.sub(r"^[^a-z0-9]+|[^a-z0-9]+$", "", derived)[:MAX_NAME_LENGTH].strip("-.")
    return derived if derived and _SUBDOMAIN.match(derived) else "paretopolicy"


def parse_stage(text: str) -> BindingStage:
    """One --stage, MODEL[+MODEL...]:PARAM[,PARAM...], as a binding stage."""
    models, _, names = text.partition(":")
    components = [m.strip() for m in models.split("+") if m.strip()]
    parameters = [n.strip() for n in names.split(",") if n.strip()]
    if not components or not parameters:
        fail(
            "--stage",
            f"{text!r} is not MODEL:PARAM[,PARAM...]",
            "pass e.g. --stage retriever:retriever_k --stage generator:generator_model",
        )
    named = {"component": components[0]} if len(components) == 1 else {"components": components}
    try:
        return BindingStage.model_validate({**named, "parameters": parameters})
    except ValidationError as error:
        raise UsageError(f"--stage {text}: {first_error(error)[1]}") from None


def serving_choice(args: argparse.Namespace) -> dict[str, Any]:
    """The binding, strategy and admission the flags ask for, as ParetoPolicy spec
    fields; a usage error names the flag when they do not go together."""
    strategy = Strategy(args.strategy)
    whole = bool(args.whole_workflow)
    if strategy is not Strategy.ELASTICO and not whole:
        fail(
            "--strategy",
            f"{strategy.value} switches the whole workflow, and the default binds each request",
            "add --whole-workflow (for routers that cannot bind per request), or drop --strategy",
        )
    if whole and args.stage:
        fail("--stage", "binds each request, and --whole-workflow binds none", "drop one of them")
    enabled = True if args.admission else False if args.no_admission else None
    admits = enabled if enabled is not None else not whole
    tuned = {
        "--admission-quantile": args.admission_quantile,
        "--degrade-after": args.degrade_after,
        "--no-refuse": args.no_refuse or None,
    }
    for flag, value in tuned.items():
        if value is not None and not admits:
            fail(flag, "only applies with admission", f"add --admission or drop {flag}")
    defaults = AdmissionSettings()
    admission = AdmissionSettings(
        enabled=enabled,
        quantile=admission_quantile(args, defaults.quantile),
        degrade_after=admission_degrade_after(args, defaults.degrade_after),
        refuse=not args.no_refuse,
    )
    binding = BindingSettings(
        mode=BindingMode.WORKFLOW if whole else BindingMode.PER_REQUEST,
        stages=[parse_stage(text) for text in args.stage or ()],
    )
    return {
        "strategy": strategy,
        "admission": admission,
        "binding": binding,
    }


def routing_choice(args: argparse.Namespace) -> RoutingTarget | None:
    """routing from --service and --router-model (None: neither given)."""
    if args.service is None:
        if args.router_model is not None:
            fail("--router-model", "names the router of --service", "add --service NAME")
        return None
    _checked("--service", args.service, _NAMESPACE, "a DNS label: e.g. rag-sim-triton")
    fields: dict[str, Any] = {"service": args.service}
    if args.router_model is not None:
        fields["router_model"] = args.router_model
    try:
        return RoutingTarget(**fields)
    except ValidationError as error:
        raise UsageError(f"--router-model: {first_error(error)[1]}") from None


def gate_summary(spec: ParetoPolicySpec) -> str:
    """The routers' gate the plan writes, and where its slots come from."""
    gate = spec.binding.gate
    why = (
        f"the front's capacity curves show the pod serving more at {gate.slots} at once"
        if gate.slots > 1
        else "one pipeline at a time: no capacity curve shows the pod serving more at once"
    )
    return (
        f"gate: {gate.instances} router instances, {gate.slots} pipeline slot(s) "
        f"(binding.gate.slots: {why})"
    )


def plan_command(args: argparse.Namespace) -> int:
    """`compass plan`: front, thresholds, policy file (and a plot)."""
    slo_ms = parse_number("--slo-ms", str(args.slo_ms), "1000", low=0, inclusive=False)
    percentile = parse_number("--percentile", str(args.percentile), "95", low=0, inclusive=False)
    if percentile >= 100:
        fail("--percentile", f"{args.percentile} is not below 100", "pass e.g. --percentile 95")
    slack = parse_number("--slack-ms", str(args.slack_ms), "50", low=0, inclusive=True)
    output = Path(str(args.output))
    check_output("--output", output, {"--profiles": args.profiles})
    plot = None if args.plot is None else Path(str(args.plot))
    if plot is not None:
        check_output("--plot", plot, {"--profiles": args.profiles, "--output": output})
    name = policy_name_of(args.name, output)
    namespace = args.namespace
    if namespace is not None:
        _checked("--namespace", namespace, _NAMESPACE, "a DNS label: e.g. serving")
    form = args.format or ("json" if output.suffix.lower() == ".json" else "yaml")
    servers = parse_int(
        "--router-instances", str(args.router_instances), "4", low=1, high=MAX_ROUTER_INSTANCES
    )
    serving = serving_choice(args)
    routing = routing_choice(args)
    profiles = load_profiles(Path(str(args.profiles)))
    check_front_size(Path(str(args.profiles)), profiles, percentile)
    try:
        plan = plan_from_profiles(
            profiles,
            Slo(slo_ms, percentile),
            slack,
            ThresholdModel(args.model),
            servers=servers,
        )
    except PlanError as exc:
        raise plan_error(exc) from None
    try:
        spec = spec_for_plan(plan, **serving, routing=routing)
    except ValidationError as error:
        raise UsageError(f"--stage: {first_error(error)[1]}") from None
    manifest = policy_manifest(spec, name, namespace)
    print(
        f"compass plan: {len(profiles)} profiles -> Pareto front of {len(plan.thresholds)} "
        f"(accuracy up, p{percentile:g} down), fastest first; SLO {slo_ms:g} ms at "
        f"p{percentile:g}, slack buffer {slack:g} ms, model {plan.model.value}; "
        + serving_summary(spec)
    )
    if spec.binding.mode.per_request:
        print(gate_summary(spec))
    print(plan_table(plan))
    print(
        "stay<=N: switch faster when more requests wait; enter<=N: switch to it only when "
        "at most N wait"
        + (
            f"; qps: the same for the arrival rate ({RATE_MODELS[plan.model]})"
            if plan.model.with_rates
            else ""
        )
    )
    write_text(output, policy_text(manifest, form))
    print(f"policy: {output}")
    if plot is not None:
        save_output(plot, lambda temporary: plots.save_plan_figure(temporary, plan, profiles))
        print(f"plot: {plot}")
    return 0
