"""Two real tritonservers as two replicas: switched together, read together, one lost and back."""

from __future__ import annotations

import statistics
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from ragsim import ACCURATE, FASTEST, TIME_SCALE

from compass.dataplane.fleet import Endpoint, FleetQueueDepth, RouterFleet
from compass.dataplane.load import RequestRecord, run_load
from compass.dataplane.metrics import SharedReads
from compass.dataplane.triton import TritonRouter, parse_routing_key, routing_key
from compass.domain.space import config_key
from compass_dev.local_triton import LocalTriton, free_port
from compass_dev.scenarios import rag_sim_fleet, rag_sim_triton
from tiers import require_tritonserver

HOSTS = ("127.0.3.11", "127.0.3.12")


def _endpoint(name: str, server: LocalTriton) -> Endpoint:
    return Endpoint(name, server.grpc_url, server.metrics_url)


@pytest.fixture(scope="module")
def replicas(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[LocalTriton]]:
    """Two rag-sim servers on their own loopback addresses, FASTEST by default."""
    require_tritonserver()
    servers = []
    try:
        for k, host in enumerate(HOSTS):
            workdir = tmp_path_factory.mktemp(f"replica{k}")
            servers.append(rag_sim_triton(workdir, TIME_SCALE, FASTEST, host=host).start(workdir))
        yield servers
    finally:
        for server in servers:
            server.stop()


@pytest.fixture
def fleet(replicas: list[LocalTriton]) -> Iterator[RouterFleet]:
    """Both replicas, serving FASTEST at the start of each test."""
    routers = RouterFleet([_endpoint(f"pod{k}", s) for k, s in enumerate(replicas)])
    routers.switch(FASTEST)
    yield routers
    routers.close()


def _served_by(server: LocalTriton) -> str:
    client = TritonRouter(server.grpc_url)
    try:
        return client.infer({"sample": 0}).config
    finally:
        client.close()


def test_every_replica_switches_under_load_and_no_request_fails(
    replicas: list[LocalTriton], fleet: RouterFleet
) -> None:
    """Open-loop load split over both replicas while the fleet switches back and forth."""
    # 40 QPS for 4 s, half to each replica: two thirds of ACCURATE's capacity, so that its queue
    # drains within a window even beside a busy neighbour (at 60 QPS it grew past the windows).
    arrivals = [i / 40 for i in range(160)]
    records: list[RequestRecord] = []

    def load() -> None:
        records.extend(
            run_load(
                [s.grpc_url for s in replicas],
                arrivals,
                lambda i: {"sample": i % 100},
                replicas=[i % 2 for i in range(len(arrivals))],
            )
        )

    thread = threading.Thread(target=load)
    started = time.perf_counter()
    thread.start()
    switches = []
    for config in [ACCURATE, FASTEST, ACCURATE, FASTEST, ACCURATE]:
        time.sleep(0.6)
        report = fleet.switch(config)
        switches.append((time.perf_counter() - started, report))
        assert (report.config, report.serving, report.lagging) == (config_key(config), 2, ())
        assert {_served_by(s) for s in replicas} == {config_key(config)}
    thread.join(timeout=60)
    assert not thread.is_alive()
    assert len(records) == len(arrivals)
    assert [r.error for r in records if r.error] == []
    # Sent after a switch returned, answered before the next: the switched configuration. (The
    # load's clock started a moment after ours: a margin keeps the two apart.)
    # A window may hold no whole request when the machine is busy (2 shared cores): every
    # request that fits one must be the switched configuration, and most windows hold some.
    ends = [t for t, _ in switches[1:]] + [float("inf")]
    checked = 0
    for (returned, report), end in zip(switches, ends, strict=True):
        between = {
            r.config for r in records if returned + 0.05 < r.sent_s and r.sent_s + r.latency_s < end
        }
        assert between <= {report.config}
        checked += bool(between)
    assert checked >= 3, f"only {checked} of {len(switches)} windows held a whole request"
    # A reload took 150-600 ms here; two control requests in parallel take a few ms.
    assert statistics.median(report.seconds for _, report in switches) < 0.1


def test_an_unreachable_replica_does_not_stop_the_others(
    replicas: list[LocalTriton], fleet: RouterFleet
) -> None:
    dead = Endpoint("gone", f"127.0.3.19:{free_port()}")
    fleet.update([*fleet.endpoints, dead])
    report = fleet.switch(ACCURATE)
    assert report.serving == 2
    assert [p.pod for p in report.lagging] == ["gone"]
    assert report.lagging[0].error
    assert {_served_by(s) for s in replicas} == {config_key(ACCURATE)}


def test_the_queue_is_read_per_pod(replicas: list[LocalTriton], fleet: RouterFleet) -> None:
    """A burst on one replica only: the mean over two pods is half its depth; arrivals per pod."""
    source = FleetQueueDepth(lambda: fleet.endpoints)
    first = source.read()
    assert (first.pods, first.queue_depth) == (2, 0.0)
    fleet.switch(ACCURATE)
    done = threading.Event()
    peak = {"mean": 0.0, "single": 0.0}
    single = FleetQueueDepth(lambda: fleet.endpoints[:1])

    def poll() -> None:
        while not done.is_set():
            peak["mean"] = max(peak["mean"], source.read().queue_depth)
            peak["single"] = max(peak["single"], single.read().queue_depth)
            time.sleep(0.05)

    poller = threading.Thread(target=poll)
    poller.start()
    records = run_load(replicas[0].grpc_url, [0.0] * 40, lambda i: {"sample": i})
    done.set()
    poller.join()
    assert not [r for r in records if r.error]
    assert peak["single"] >= 10
    assert peak["mean"] <= peak["single"] / 2 + 2  # the idle replica halves it
    after = source.read()
    assert after.arrivals_total is not None
    assert first.arrivals_total is not None
    # 40 arrivals over two pods: 20 per pod (the counter lags by the one in service at most).
    assert after.arrivals_total - first.arrivals_total == pytest.approx(20, abs=1)


def test_a_restarted_replica_is_brought_to_the_active_configuration(
    replicas: list[LocalTriton], fleet: RouterFleet, tmp_path: Path
) -> None:
    """The restarted server starts from its default (FASTEST); the next switch call fixes it."""
    fleet.switch(ACCURATE)
    lost = replicas[1]
    lost.stop()
    report = fleet.switch(ACCURATE)
    assert [p.pod for p in report.lagging] == ["pod1"]
    restarted = LocalTriton(
        repository=lost.repository,
        host=lost.host,
        http_port=lost.http_port,
        grpc_port=lost.grpc_port,
        metrics_port=lost.metrics_port,
    ).start(tmp_path)
    replicas[1] = restarted
    assert _served_by(restarted) == config_key(FASTEST)
    # As the live loop does every tick: the client reconnects within its 0.5 s back-off cap.
    changed: list[str] = []
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:
        again = fleet.switch(ACCURATE)
        changed += [p.pod for p in again.pods if p.changed]
        if again.serving == 2:
            break
        time.sleep(0.2)
    assert (again.serving, changed) == (2, ["pod1"])
    assert _served_by(restarted) == config_key(ACCURATE)


def test_compass_serve_keeps_every_replica_on_the_active_configuration(
    replicas: list[LocalTriton], fleet: RouterFleet, tmp_path: Path
) -> None:
    """Replicas that disagree are brought to one configuration by the loop's every tick."""
    from compass.commands.main import main

    TritonRouter(replicas[1].grpc_url).switch(ACCURATE)  # pod0 FASTEST, pod1 ACCURATE
    front = [
        {"config": FASTEST, "accuracy": 0.837, "latencyMeanMs": 20, "latencyP95Ms": 25},
        {"config": ACCURATE, "accuracy": 0.863, "latencyMeanMs": 33, "latencyP95Ms": 40},
    ]
    policy = {
        "front": front,
        "slo": {"latencyMs": 100, "percentile": 95},
        "hysteresis": {"downscaleCooldownSeconds": 30},
        "intervalSeconds": 0.2,
    }
    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump(policy))
    code = main(
        [
            "serve",
            "--policy",
            str(path),
            "--triton",
            ",".join(s.grpc_url for s in replicas),
            "--metrics",
            ",".join(s.metrics_url for s in replicas),
            "--duration",
            "1",
        ]
    )
    assert code == 0
    # A tie starts from the first replica's FASTEST; a 30 s cooldown keeps it there.
    assert {_served_by(s) for s in replicas} == {config_key(FASTEST)}


def test_compass_serve_wants_one_metrics_url_per_replica(
    replicas: list[LocalTriton], capsys: pytest.CaptureFixture[str]
) -> None:
    from compass.commands.main import main

    arguments = ["--triton", ",".join(s.grpc_url for s in replicas)]
    code = main(["serve", "--policy", "unused.yaml", *arguments, "--metrics", "http://m/x"])
    assert code == 2
    assert "--metrics: 1 metrics URL(s) for 2 Triton replica(s)" in capsys.readouterr().err


def test_a_pod_on_its_default_does_not_outvote_the_expected_configuration(
    replicas: list[LocalTriton], fleet: RouterFleet
) -> None:
    """One pod restarted on FASTEST, one on the policy's ACCURATE: a tie the policy must win."""
    TritonRouter(replicas[1].grpc_url).switch(ACCURATE)
    assert fleet.active_config() == config_key(FASTEST)  # a tie, no expectation: the first pod
    assert fleet.active_config(expected=config_key(ACCURATE)) == config_key(ACCURATE)
    # An expectation no pod serves is not invented: the pods' own answer stands.
    third = {**ACCURATE, "retriever_k": 10}
    assert fleet.active_config(expected=config_key(third)) == config_key(FASTEST)


def test_every_replica_takes_the_blend_and_a_pod_on_another_weight_is_brought_back(
    replicas: list[LocalTriton], fleet: RouterFleet
) -> None:
    """A mix reaches every pod; a pod on the same configurations at another weight does not
    outvote the policy's routing, and the next switch brings it back."""
    wanted = routing_key(FASTEST, ACCURATE, 0.25)
    report = fleet.switch(FASTEST, ACCURATE, 0.25)
    assert (report.config, report.serving, report.lagging) == (wanted, 2, ())
    assert fleet.active_config() == wanted
    other = TritonRouter(replicas[1].grpc_url)
    try:
        other.switch(FASTEST, ACCURATE, 0.5)
        assert fleet.active_config(expected=wanted) == wanted
        # The next switch (every tick repeats it) brings the pod back to the policy's weight.
        again = fleet.switch(FASTEST, ACCURATE, 0.25)
        assert (again.serving, again.changed) == (2, True)
        assert [p.changed for p in again.pods] == [False, True]
        assert parse_routing_key(other.active_config())[2] == 0.25
    finally:
        other.close()


def _control_calls_now(server: LocalTriton) -> float:
    """Requests the router's control model has answered so far (Triton's own counter)."""
    with urllib.request.urlopen(server.metrics_url, timeout=5) as answer:
        text = answer.read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("nv_inference_request_success{") and 'model="router_control"' in line
    )


def _control_calls(servers: list[LocalTriton]) -> list[float]:
    """Each server's control-model count once it has settled: the Python backend reports a
    request's statistics after its response has left, so on a loaded machine the count of a
    call the client has already seen answered can lag behind it."""
    counts = [_control_calls_now(s) for s in servers]
    deadline = time.monotonic() + 10.0
    while time.monotonic() < deadline:
        time.sleep(0.3)
        again = [_control_calls_now(s) for s in servers]
        if again == counts:
            break
        counts = again
    return counts


def test_policies_on_one_pod_share_its_report_and_a_served_routing_is_not_set_again(
    replicas: list[LocalTriton],
) -> None:
    """Ten fleets on the same two pods in one tick: one report a pod; a hold on what the pods
    report sends nothing, a switch sends the set; a new admission table is sent once, then a
    hold sends nothing (the pods report the digest of the tables they hold), and so is the
    first hold after it was turned off (the table must go)."""
    shared = SharedReads()
    fleets = [RouterFleet([_endpoint(f"pod{k}", s) for k, s in enumerate(replicas)])]
    fleets += [RouterFleet(fleets[0].endpoints) for _ in range(9)]
    try:
        for each in fleets:
            each.shared = shared
            each.switch(FASTEST)  # each has set the pods once, with no admission table
        before = _control_calls(replicas)
        shared.next_round()
        assert {each.active_config() for each in fleets} == {config_key(FASTEST)}
        held = [each.switch(FASTEST) for each in fleets]  # a hold: every pod serves it
        after = _control_calls(replicas)
        assert [a - b for a, b in zip(after, before, strict=True)] == [1.0, 1.0]
        assert all(report.serving == 2 and not report.changed for report in held)

        shared.next_round()
        fleets[0].active_config()
        moved = fleets[0].switch(ACCURATE)  # a switch is sent to every pod
        assert moved.changed
        assert [_served_by(s) for s in replicas] == [config_key(ACCURATE)] * 2

        fastest, accurate = config_key(FASTEST), config_key(ACCURATE)
        fleets[1].admission = {"quantiles_ms": {fastest: 20.0, accurate: 35.0}, "fastest": fastest}
        for expected in ([1.0, 1.0], [0.0, 0.0]):
            shared.next_round()
            fleets[1].active_config()
            sent = _control_calls(replicas)
            fleets[1].switch(ACCURATE)
            assert [a - b for a, b in zip(_control_calls(replicas), sent, strict=True)] == expected

        fleets[1].admission = None  # turned off: the next hold clears the pods' table
        for expected in ([1.0, 1.0], [0.0, 0.0]):
            shared.next_round()
            fleets[1].active_config()
            sent = _control_calls(replicas)
            fleets[1].switch(ACCURATE)
            assert [a - b for a, b in zip(_control_calls(replicas), sent, strict=True)] == expected
    finally:
        for each in fleets:
            each.close()
        TritonRouter(replicas[0].grpc_url).switch(FASTEST)
        TritonRouter(replicas[1].grpc_url).switch(FASTEST)


def test_a_search_fleet_serves_on_addresses_of_its_own_and_stops_on_leaving(
    tmp_path: Path,
) -> None:
    """rag_sim_fleet as `compass demo` and bench/search_concurrency.py --live start it: two
    servers, each on its own loopback address with a router of two instances, both answering;
    no process left once the fleet is left."""
    require_tritonserver()
    with rag_sim_fleet(tmp_path, 0.0, 2, router_instances=2) as servers:
        assert [s.host for s in servers] == ["127.0.3.1", "127.0.3.2"]
        for server in servers:
            router = TritonRouter(server.grpc_url)
            try:
                assert router.infer({"sample": 0}).config
                config = router.client.get_model_config(router.model, as_json=True)["config"]
            finally:
                router.close()
            assert [group["count"] for group in config["instance_group"]] == [2]
        processes = [s.process for s in servers]
    assert all(p is not None and p.poll() is not None for p in processes)
