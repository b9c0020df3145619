"""Where the Jobs send to Triton: the pods of the workflow's Service, and the TLS to use."""

from __future__ import annotations

import os
from collections.abc import Callable, Collection, Iterable
from typing import Any

from kubernetes import client

from compass.api.compoundworkflow import CompoundWorkflowSpec
from compass.controllers import kubeapi, metricsauth
from compass.controllers.builders import evaluated_spec, routing_target, triton_address
from compass.controllers.endpoints import (
    PortError,
    SliceEntry,
    admitted,
    pod_addresses,
    ready_endpoints,
    slice_entries,
)
from compass.controllers.targets import TargetAccess
from compass.dataplane.fleet import Endpoint
from compass.dataplane.triton import GrpcTls


def triton_tls(spec: CompoundWorkflowSpec, namespace: str, api: Any = None) -> GrpcTls | None:
    """The Jobs' TLS to Triton (spec.triton.tls), from its Secret, which the Job's Role lets it
    get by name, under the operator's Secret rules (metricsauth.triton_tls: the consent label,
    the keys, PEM); None: plaintext. CredentialsError naming the Secret, the key and the fix."""
    tls = spec.triton.tls
    if tls is None:
        return None
    core = api if api is not None else client.CoreV1Api(kubeapi.load_client())
    secret = kubeapi.read(core.read_namespaced_secret, tls.secret_ref.name, namespace)
    return metricsauth.triton_tls(tls, secret, namespace, "spec.triton.tls", "workflow")


def triton_pods(
    spec: CompoundWorkflowSpec, namespace: str, api: Any = None
) -> tuple[list[Endpoint], str]:
    """The Triton pods the Jobs send to, and where they came from: the operator's override, else
    the ready pods of the (evaluation) Service's EndpointSlices, else its one address (in another
    namespace, or its slices unreadable)."""
    override = os.environ.get("COMPASS_TRITON_ADDRESS")
    if override:
        addresses = list(dict.fromkeys(a.strip() for a in override.split(",") if a.strip()))
        return [Endpoint(a, a) for a in addresses], "COMPASS_TRITON_ADDRESS"
    spec = evaluated_spec(spec)
    workflow = {"metadata": {"namespace": namespace}}
    address = triton_address(workflow, spec)
    service = routing_target(workflow, spec).service
    one = [Endpoint(address, address)]
    if service is None:
        return one, f"Service {address}, in another namespace: its pods are not listed"
    api = api or kubeapi.load_client()
    try:
        slices = kubeapi.list_endpoint_slices(api, namespace, service)
        entries = [slice_entries(s) for s in slices]
        kept, refused = admitted(entries, namespace, pod_holders(api, namespace, entries), OWN)
        pods = ready_endpoints([kept], spec.triton.grpc_port, None)
    except PortError as error:
        return one, f"Service {address}: {error}"
    except kubeapi.ERRORS as error:
        reason = kubeapi.describe(error)
        return one, f"Service {address}: its EndpointSlices could not be read ({reason})"
    left_out = f"; left out, not Pods of {namespace}: {'; '.join(refused)}" if refused else ""
    if not pods:
        return one, f"Service {address}: its EndpointSlices list no ready pod{left_out}"
    return list(pods), f"the ready pods of Service {service}{left_out}"


# The Jobs measure what the operator would switch: a slice's address only where it is a Pod of
# the workflow's namespace at that IP (no allowedHosts: the Jobs run in the cluster).
OWN = TargetAccess()


def pod_holders(
    api: Any, namespace: str, entries: Iterable[Iterable[SliceEntry]]
) -> Callable[[str], Collection[str]]:
    """Which of the Pods the slices name hold each IP, each Pod read once by name (the Job's
    Role may get Pods, not list them): what ``endpoints.admitted`` checks a slice against, so
    a hand-made slice cannot aim the Jobs at another namespace's pods."""
    core = client.CoreV1Api(api)
    named = {e.pod for group in entries for e in group if e.kind == "Pod" and e.ready}
    holders: dict[str, set[str]] = {}
    for name in sorted(named):
        body = kubeapi.read(core.read_namespaced_pod, name, namespace)
        for ip in pod_addresses(body or {}):
            holders.setdefault(ip, set()).add(name)
    return lambda ip: holders.get(ip, set())
