"""The operator's Kubernetes I/O: each call with a timeout, its JSON, 404 and 409 typed."""

from __future__ import annotations

import functools
import json
import os
import re
from collections.abc import Callable, Mapping
from typing import Any

import urllib3
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

# controller_uid is pure: it lives beside owner_reference, where the pure decisions take it.
from compass.controllers.builders import FIELD_MANAGER
from compass.controllers.builders import controller_uid as controller_uid

# (connect, read) seconds for every call: without one, a half-open connection blocks a handler
# thread forever. Generous (a false timeout costs only a retry); urllib3 retries a GET 3 times.
REQUEST_TIMEOUT_S: tuple[float, float] = (5.0, 15.0)

# What a failed call raises: the server's answer, or no answer (refused, reset, timed out).
ERRORS: tuple[type[Exception], ...] = (ApiException, urllib3.exceptions.HTTPError, OSError)

_MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
# Server-side apply. The client serializes a dict body as JSON for a +yaml type (JSON is YAML),
# but picks no apply type by itself: it has to be named.
_APPLY_PATCH = "application/apply-patch+yaml"


class NotFoundError(ApiException):
    """404: the object, its namespace or its resource type does not exist."""


class ConflictError(ApiException):
    """409: the name is taken (create), or the object changed since it was read (write)."""


class OwnedByAnotherError(Exception):
    """An object with the wanted name exists and belongs to something else."""


def load_client(connections: int = 0) -> client.ApiClient:
    """A client of its own: in-cluster, else $KUBECONFIG as it is now, else ~/.kube/config."""
    configuration = client.Configuration()
    # One connection per calling thread: none closed and opened again with a TLS handshake.
    configuration.connection_pool_maxsize = max(configuration.connection_pool_maxsize, connections)
    try:
        config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    except config.ConfigException:
        config.load_kube_config(  # type: ignore[no-untyped-call]
            config_file=os.environ.get("KUBECONFIG"), client_configuration=configuration
        )
    return client.ApiClient(configuration)


def call(
    method: Callable[..., Any],
    *args: Any,
    timeout: tuple[float, float] | None = None,
    answer: bool = True,
    **kwargs: Any,
) -> Any:
    """``method(*args, **kwargs)`` with a timeout; the answer's JSON (None: empty, or not asked)."""
    limits = REQUEST_TIMEOUT_S if timeout is None else timeout
    try:
        response = method(*args, **kwargs, _request_timeout=limits, _preload_content=False)
    except ApiException as error:
        typed = _typed(error)
        if typed is error:
            raise
        raise typed from error
    # Read whole (the connection goes back to the pool), parsed only when asked for: a status
    # patch answers with the whole object, which a thousand policies' writes need not parse.
    if not response.data or not answer:
        return None
    try:
        return json.loads(response.data)
    except ValueError as error:
        # Not the API server's answer (a proxy's error page, say): a failed call like any other,
        # so every caller that survives a failed call survives this one too.
        raise ApiException(
            status=response.status, reason=f"the answer is not JSON ({error})"
        ) from error


def read(method: Callable[..., Any], *args: Any) -> Any:
    """The object, or None if it does not exist."""
    try:
        return call(method, *args)
    except NotFoundError:
        return None


def list_items(method: Callable[..., Any], *args: Any, **kwargs: Any) -> list[dict[str, Any]]:
    """The ``items`` of a list call (e.g. with label_selector=...)."""
    return list(call(method, *args, **kwargs).get("items") or [])


# A list answered with each object's metadata alone (Kubernetes 1.15 and later): what a
# namespace's objects hold is never read whole to find the few that are the operator's.
METADATA_ONLY = {"Accept": "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"}


def list_metadata(method: Callable[..., Any], *args: Any, **kwargs: Any) -> list[dict[str, Any]]:
    """The ``items`` of a list call, each its ``metadata`` only (names, labels, owners)."""
    return list_items(method, *args, _headers=METADATA_ONLY, **kwargs)


# discovery.k8s.io's versions, newest first: v1 from Kubernetes 1.21, v1beta1 before (and until
# 1.25). kopf's EndpointSlice index is versionless the same way.
SLICE_VERSIONS = ("v1", "v1beta1")


def list_endpoint_slices(
    api: client.ApiClient, namespace: str, service: str
) -> list[dict[str, Any]]:
    """``service``'s EndpointSlices, from the newest discovery.k8s.io version the server serves."""
    for version in SLICE_VERSIONS:

        def listing(
            *, _request_timeout: Any, _preload_content: bool, version: str = version
        ) -> Any:
            """A list call as a generated method makes it, at this version's path."""
            request = api.param_serialize(
                method="GET",
                resource_path=f"/apis/discovery.k8s.io/{version}/namespaces/{{namespace}}/"
                "endpointslices",
                path_params={"namespace": namespace},
                query_params=[("labelSelector", f"kubernetes.io/service-name={service}")],
                header_params={"Accept": "application/json"},
                auth_settings=["BearerToken"],
            )
            response = api.call_api(*request, _request_timeout=_request_timeout)
            response.read()  # type: ignore[no-untyped-call]
            if not 200 <= response.status <= 299:
                raise ApiException.from_response(http_resp=response, body=None, data=None)
            return response.response

        try:
            return list_items(listing)
        except NotFoundError:
            if version == SLICE_VERSIONS[-1]:
                raise
    raise AssertionError("unreachable")


# Creates of one object tried while another of its name keeps appearing and vanishing.
CREATE_ATTEMPTS = 3


def create(method: Callable[..., Any], *args: Any) -> Any:
    """The created object, or None if one of that name exists already."""
    try:
        return call(method, *args)
    except ConflictError:
        return None


def create_or_take(
    create_method: Callable[..., Any],
    read_method: Callable[..., Any],
    namespace: str,
    body: Mapping[str, Any],
    whose: Callable[[Mapping[str, Any]], str | None],
) -> Any:
    """Create the object, or take the one there unless ``whose`` says whose it is (None: ours)."""
    name = body["metadata"]["name"]
    for _ in range(CREATE_ATTEMPTS):
        created = create(create_method, namespace, body)
        if created is not None:
            return created
        existing = read(read_method, name, namespace)
        if existing is None:
            continue  # collected since the conflict: create it again (else the caller believes it)
        other = whose(existing)
        if other is not None:
            raise OwnedByAnotherError(f"{body['kind']} {name} {other}")
        return existing
    raise ConflictError(
        status=409,
        reason=f"{body['kind']} {name} was made and deleted again by someone else "
        f"{CREATE_ATTEMPTS} times while it was being created",
    )


def create_or_adopt(
    create_method: Callable[..., Any],
    read_method: Callable[..., Any],
    namespace: str,
    body: Mapping[str, Any],
    owner_uid: str,
) -> Any:
    """create_or_take, taking an existing object with no controller or ``owner_uid`` as its own."""
    whose = functools.partial(controlled_by_another, owner_uid=owner_uid)
    return create_or_take(create_method, read_method, namespace, body, whose)


def controlled_by_another(existing: Mapping[str, Any], owner_uid: str) -> str | None:
    """Why ``existing`` is not ``owner_uid``'s to take (another controls it); None if it is."""
    other = controller_uid(existing)
    return None if other in (None, owner_uid) else f"is controlled by another owner ({other})"


def patch_status(method: Callable[..., Any], *args: Any, body: Mapping[str, Any]) -> bool:
    """Merge-patch a status; False if the object is gone or changed since the body's version."""
    try:
        call(method, *args, body, _content_type=_MERGE_PATCH, answer=False)
    except (NotFoundError, ConflictError):
        return False
    return True


def apply(
    method: Callable[..., Any],
    *args: Any,
    body: Mapping[str, Any],
    force: bool = True,
    field_manager: str = FIELD_MANAGER,
) -> Any:
    """Server-side apply ``body`` as ``field_manager``; ``force``: take over others' fields."""
    return call(
        method, *args, body, field_manager=field_manager, force=force, _content_type=_APPLY_PATCH
    )


# The 422 of a JSON patch that did not apply: the failed ``test`` op named, or (1.20, say) only
# this generic line with no causes; one that made the object invalid names the field instead.
_TEST_FAILED = re.compile(r"\btesting value \S* ?failed", re.IGNORECASE)
_NOT_APPLIED = "the server rejected our request due to an error in our request"


class PatchRefusedError(ApiException):
    """A JSON patch refused (422) other than by a failed ``test`` op: retrying will not help."""

    def __str__(self) -> str:
        return f"JSON patch refused (HTTP {self.status}): {answer_message(self) or self.reason}"


def _status(error: ApiException) -> dict[str, Any]:
    """The API server's Status answer, if the body is one."""
    try:
        answer = json.loads(error.body or "")
    except (TypeError, ValueError):
        return {}
    return answer if isinstance(answer, dict) else {}


def answer_message(error: ApiException) -> str:
    """The message of the API server's Status answer ('' if it gave none)."""
    message = _status(error).get("message")
    return message if isinstance(message, str) else ""


def _not_applied(error: ApiException) -> bool:
    """Whether a 422 says the patch did not apply to the object as it is now (a failed test op)."""
    status = _status(error)
    message = answer_message(error)
    if _TEST_FAILED.search(message):
        return True
    details = status.get("details")
    causes = details.get("causes") if isinstance(details, dict) else None
    return message == _NOT_APPLIED and not causes


def json_patch(method: Callable[..., Any], *args: Any, ops: list[dict[str, Any]]) -> bool:
    """Apply a JSON patch (RFC 6902); False if a ``test`` op failed or the object is gone."""
    try:
        call(method, *args, ops, field_manager=FIELD_MANAGER, _content_type=JSON_PATCH)
    except NotFoundError:
        return False
    except ApiException as error:
        if error.status != 422:
            raise
        if _not_applied(error):
            return False
        raise _typed(error, PatchRefusedError) from error
    return True


def delete(method: Callable[..., Any], *args: Any, **kwargs: Any) -> bool:
    """Delete (e.g. with propagation_policy=...); False if it was gone already."""
    try:
        call(method, *args, **kwargs)
    except NotFoundError:
        return False
    return True


def describe(error: BaseException) -> str:
    """A failed call in one line for a log: the HTTP status and answer, or the transport error."""
    if isinstance(error, ApiException):
        return f"HTTP {error.status}: {error.body or error}"
    return str(error)


def _typed(error: ApiException, kind: type[ApiException] | None = None) -> ApiException:
    """The error as ``kind``, else NotFoundError or ConflictError where it is one, else itself."""
    kind = kind or {404: NotFoundError, 409: ConflictError}.get(error.status)
    if kind is None:
        return error
    typed = kind(status=error.status, reason=error.reason)
    typed.body, typed.headers = error.body, error.headers
    return typed
