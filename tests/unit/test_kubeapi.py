"""compass.controllers.kubeapi without an API server: its pure helpers, and the request timeout
against a server that accepts connections and never answers (what no real API server shows on
demand). The helpers against a real API server: tests/k8s/test_kubeapi_server.py."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import urllib3
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from compass.controllers import kubeapi


def test_the_controller_is_the_owner_marked_controller() -> None:
    owned = {
        "metadata": {
            "ownerReferences": [
                {"uid": "plain", "kind": "ConfigMap"},
                {"uid": "boss", "kind": "CompoundWorkflow", "controller": True},
            ]
        }
    }
    assert kubeapi.controller_uid(owned) == "boss"
    assert kubeapi.controller_uid({"metadata": {"ownerReferences": [{"uid": "x"}]}}) is None
    assert kubeapi.controller_uid({"metadata": {}}) is None


def test_404_and_409_get_their_own_types_and_keep_what_the_server_said() -> None:
    for status, kind in ((404, kubeapi.NotFoundError), (409, kubeapi.ConflictError)):
        error = ApiException(status=status, reason="Why")
        error.body, error.headers = '{"message": "m"}', {"h": "v"}
        typed = kubeapi._typed(error)
        assert isinstance(typed, kind)
        assert isinstance(typed, ApiException)
        assert (typed.status, typed.reason, typed.body, typed.headers) == (
            status,
            "Why",
            '{"message": "m"}',
            {"h": "v"},
        )
    other = ApiException(status=500, reason="Boom")
    assert kubeapi._typed(other) is other


def test_describe_names_the_status_or_the_transport_error() -> None:
    error = ApiException(status=500, reason="Internal")
    error.body = "etcd unavailable"
    assert kubeapi.describe(error) == "HTTP 500: etcd unavailable"
    assert kubeapi.describe(ConnectionRefusedError("refused")) == "refused"


@pytest.fixture
def silent_server() -> Iterator[int]:
    """A TCP port whose server accepts every connection and never answers."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.1)
        while not stop.is_set():
            try:
                accepted.append(listener.accept()[0])
            except TimeoutError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield listener.getsockname()[1]
    stop.set()
    thread.join()
    for connection in accepted:
        connection.close()
    listener.close()


def _kubeconfig(path: Path, port: int) -> Path:
    path.write_text(
        f"""apiVersion: v1
kind: Config
clusters:
- name: silent
  cluster: {{server: "http://127.0.0.1:{port}"}}
users:
- name: nobody
  user: {{token: "t"}}
contexts:
- name: silent
  context: {{cluster: silent, user: nobody}}
current-context: silent
""",
        encoding="utf-8",
    )
    return path


def test_load_client_reads_kubeconfig_as_it_is_now(
    silent_server: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)  # not in a pod
    monkeypatch.setenv("KUBECONFIG", str(_kubeconfig(tmp_path / "config", silent_server)))
    api = kubeapi.load_client()
    assert api.configuration.host == f"http://127.0.0.1:{silent_server}"


def test_every_call_gives_up_after_the_request_timeout(
    silent_server: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", str(_kubeconfig(tmp_path / "config", silent_server)))
    monkeypatch.setattr(kubeapi, "REQUEST_TIMEOUT_S", (1.0, 0.1))
    core = client.CoreV1Api(kubeapi.load_client())
    body = {"metadata": {"name": "x"}}
    calls = {
        # urllib3 retries a GET or DELETE 3 times: 4 attempts of 0.1 s.
        "read": lambda: kubeapi.read(core.read_namespaced_config_map, "x", "ns"),
        "list": lambda: kubeapi.list_items(core.list_namespaced_config_map, "ns"),
        "create": lambda: kubeapi.create(core.create_namespaced_config_map, "ns", body),
        "delete": lambda: kubeapi.delete(core.delete_namespaced_config_map, "x", "ns"),
        "patch_status": lambda: kubeapi.patch_status(
            client.CustomObjectsApi(core.api_client).patch_namespaced_custom_object_status,
            "g",
            "v1",
            "ns",
            "things",
            "x",
            body={"status": {}},
        ),
    }
    for what, call in calls.items():
        raised = _raised_within(call, 30)
        # What the controllers catch, and caused by the read timeout (not refused, not a 4xx).
        assert isinstance(raised, kubeapi.ERRORS), f"{what}: {raised!r}"
        assert _read_timeout(raised), f"{what}: {raised!r}"


def _raised_within(call: Callable[[], object], bound_s: float) -> BaseException | None:
    """What ``call()`` raised, run in a thread; a call still blocked after ``bound_s`` fails
    the test (the bound only stops a hang; it is no assertion on speed)."""
    raised: list[BaseException] = []

    def run() -> None:
        try:
            call()
        except BaseException as error:  # handed to the test
            raised.append(error)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(bound_s)
    assert not thread.is_alive(), f"still blocked after {bound_s} s: no request timeout"
    return raised[0] if raised else None


def _read_timeout(error: BaseException | None) -> bool:
    """The read timeout: urllib3 raises it as is, or, for a method it retries (GET, DELETE),
    as the reason of the MaxRetryError after its last attempt."""
    if isinstance(error, urllib3.exceptions.MaxRetryError):
        error = error.reason
    return isinstance(error, urllib3.exceptions.ReadTimeoutError)


def _refusing(message: str, reason: str = "") -> Callable[..., object]:
    """A patch method the API server answers 422 with this Status message and reason."""

    def patch(*args: object, **kwargs: object) -> object:
        error = ApiException(status=422, reason="Unprocessable Entity")
        error.body = json.dumps(
            {"kind": "Status", "status": "Failure", "message": message, "reason": reason}
        )
        raise error

    return patch


OPS = [{"op": "test", "path": "/metadata/resourceVersion", "value": "1"}]


@pytest.mark.parametrize(
    "message",
    [
        "testing value /metadata/resourceVersion failed: test failed",
        "Testing value /metadata/resourceVersion failed",
        # What kube-apiserver 1.20 answers for a failed test op (and a missing path alike).
        "the server rejected our request due to an error in our request",
    ],
)
def test_a_patch_that_did_not_apply_is_changed_meanwhile(message: str) -> None:
    assert kubeapi.json_patch(_refusing(message, "Invalid"), "x", ops=OPS) is False


@pytest.mark.parametrize(
    ("message", "reason"),
    [
        ('ParetoPolicy.compass.io "p" is invalid: spec.front: Required value', "Invalid"),
        ('Gadget.x "g" is invalid: metadata.labels: Invalid value: "a b"', "Invalid"),
        ("", ""),
    ],
)
def test_a_422_for_another_reason_is_an_error_naming_it(message: str, reason: str) -> None:
    """Once every 422 read as "changed meanwhile", and the caller retried a patch the server
    would never take every second, forever."""
    with pytest.raises(kubeapi.PatchRefusedError) as caught:
        kubeapi.json_patch(_refusing(message, reason), "x", ops=OPS)
    assert isinstance(caught.value, ApiException)
    assert caught.value.status == 422
    assert message in str(caught.value)
