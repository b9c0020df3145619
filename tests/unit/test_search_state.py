"""The search ledger in ConfigMaps: gzip chunks appended, merged, rolled over, read back in order,
resumed from, and every state call retried on transient errors only (an in-memory API)."""

from __future__ import annotations

import base64
import contextlib
import gzip
import importlib.util
import io
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import urllib3
from kubernetes.client.exceptions import ApiException

from compass.api.compoundworkflow import CompoundWorkflowSpec
from compass.commands import job, job_state
from compass.commands.job_state import StateStore, StateStoreError
from compass.controllers import kubeapi, ledgerchunks
from compass.controllers.builders import (
    LEDGER_KEY,
    PROGRESS_KEY,
    RESULT_KEY,
    build_state_config_maps,
)
from compass.controllers.ledgerchunks import (
    BUDGET,
    CHUNK_OF_LABEL,
    chunk_key,
    config_map_size,
    decode,
    encode,
    ledger_text,
)
from compass.controllers.workflow_state import (
    refusal_message,
    state_recogniser,
    stored_states,
)
from compass.examples import build_replay_ledger, load_rag_paper
from compass_dev.scenarios import RAG_CORNER_SPACE

_BENCH = Path(__file__).resolve().parents[2] / "bench" / "search_state.py"
_spec = importlib.util.spec_from_file_location("bench_search_state", _BENCH)
assert _spec is not None
assert _spec.loader is not None
bench = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = bench
_spec.loader.exec_module(bench)

NS = "ml"
STATE = "rag-search-g1"
OWNER = {"apiVersion": "compass.io/v1alpha1", "kind": "CompoundWorkflow", "name": "rag"}


def _line(config: int, sample: int) -> str:
    fact = {"config": {"generator_model": f"m{config}", "retriever_k": 10}, "samples": [sample]}
    # A score that varies like a real metric's, so that gzip does not make every line vanish.
    score = ((config * 7919 + sample * 104729) % 1000003) / 1000003
    return json.dumps({**fact, "scores": [score]}) + "\n"


def _state(api: Any, **data: str) -> None:
    api.objects[STATE] = {
        "metadata": {
            "name": STATE,
            "namespace": NS,
            "labels": {"compass.io/workflow": "rag", "compass.io/generation": "1"},
            "ownerReferences": [{**OWNER, "uid": "u1", "controller": True}],
        },
        "data": dict(data),
    }


@pytest.fixture
def small(monkeypatch: pytest.MonkeyPatch) -> None:
    """Budgets a few batches fill, so that a short test merges and rolls over."""
    monkeypatch.setattr(job_state, "HOT_BUDGET", 1500)
    monkeypatch.setattr(job_state, "BUDGET", 6000)


def _hot_size(obj: dict[str, Any]) -> int:
    return sum(ledgerchunks.stored_size(v) for *_, v in ledgerchunks.ledger_chunks(obj))


class KilledError(Exception):
    """The pod dies."""


def _store(api: Any) -> tuple[StateStore, list[float]]:
    slept: list[float] = []
    return StateStore(STATE, NS, api=api, sleep=slept.append), slept


# ---------------------------------------------------------------------------- encoding and order


def test_a_chunk_round_trips_and_equal_texts_encode_equally() -> None:
    text = "".join(_line(c, s) for c in range(5) for s in range(20))
    assert decode(encode(text)) == text
    assert encode(text) == encode(text)  # no timestamp: a retried write sends the same bytes
    assert ledgerchunks.stored_size(encode(text)) < len(text) / 5


def test_the_ledger_is_the_plain_key_then_every_chunk_in_sequence_order() -> None:
    lines = [_line(0, s) for s in range(12)]
    state = {"data": {LEDGER_KEY: lines[0].rstrip("\n")}, "binaryData": {}}
    chunk = {"binaryData": {}}
    # Sequence 10 sorts after 9 (numbers, not strings), wherever each chunk lives.
    for sequence in range(1, 12):
        holder = state if sequence % 2 else chunk
        holder["binaryData"][chunk_key(sequence)] = encode(lines[sequence])
    state["binaryData"]["unrelated.bin"] = encode("not ledger\n")
    assert ledger_text([chunk, state]) == "".join(lines)
    # Batches 3..6 merged into another ConfigMap, not yet deleted here: read once.
    merged = {"binaryData": {chunk_key(3, 6): encode("".join(lines[3:7]))}}
    assert ledger_text([chunk, merged, state]) == "".join(lines)


def test_a_seeded_ledger_too_large_for_the_state_goes_to_chunk_config_maps() -> None:
    workflow = {
        "metadata": {"name": "rag", "namespace": NS, "uid": "u1", "generation": 2},
        "kind": "CompoundWorkflow",
    }
    spec = CompoundWorkflowSpec.model_validate(bench.rag_workflow(100, 0.8)["spec"])
    # Random scores do not compress: about 3 MB of gzip.
    rng = __import__("random").Random(1)
    text = "".join(
        json.dumps(
            {"config": {"c": c}, "samples": [s], "scores": [rng.random() for _ in range(40)]}
        )
        + "\n"
        for c in range(200)
        for s in range(20)
    )
    state, *chunks = build_state_config_maps(workflow, spec, {LEDGER_KEY: text})
    assert "binaryData" not in state
    assert len(chunks) >= 2
    assert all(config_map_size(c) <= BUDGET for c in [state, *chunks])
    assert [c["metadata"]["name"] for c in chunks] == [
        f"rag-search-g2-c{i}" for i in range(1, len(chunks) + 1)
    ]
    assert {c["metadata"]["labels"][CHUNK_OF_LABEL] for c in chunks} == {"rag-search-g2"}
    assert all(c["metadata"]["ownerReferences"][0]["uid"] == "u1" for c in chunks)
    # What the operator reads back, listing the workflow's ConfigMaps in any order.
    listing = stored_states([*chunks[::-1], state], "rag", lambda _: 2, read=2)
    assert listing.foreign == ()
    [(generation, stored)] = listing.states.items()
    assert generation == 2
    assert stored.data[LEDGER_KEY] == text
    assert stored.names == ("rag-search-g2", *(c["metadata"]["name"] for c in chunks))


def _named(name: str, uid: str, generation: int) -> dict[str, Any]:
    labels = {"compass.io/generation": str(generation)}
    return {"metadata": {"name": name, "uid": uid, "labels": labels}}


def test_a_state_is_the_operators_by_the_uid_it_recorded_not_by_its_name() -> None:
    mine = state_recogniser("rag-search-g1", "uid-1", created={"uid-made-here"})
    own = _named("rag-search-g1", "uid-1", 1)
    forged_next = _named("rag-search-g2", "uid-tenant", 2)
    made_here = _named("rag-search-g3", "uid-made-here", 3)
    generation = lambda item: int(item["metadata"]["labels"]["compass.io/generation"])  # noqa: E731
    listing = stored_states(
        [own, forged_next, made_here], "rag", generation, read=1, operators=mine
    )
    assert sorted(listing.states) == [1, 3]
    assert listing.states[1].uid == "uid-1"
    assert listing.taken == ("rag-search-g2",)
    message = refusal_message("rag", listing)
    assert message is not None
    assert "ConfigMaps rag-search-g2 carry the names" in message
    # The recorded name alone is proof only for a status written before uids were recorded.
    assert not mine(_named("rag-search-g1", "uid-other", 1))
    assert state_recogniser("rag-search-g1", None, created=())(own)
    assert not state_recogniser("rag-search-g1", None, created=())(forged_next)


# ---------------------------------------------------------------------------- appending


def test_appends_send_only_the_new_lines_merge_out_and_roll_over_before_the_budget(
    small: None,
) -> None:
    api = bench.FakeConfigMaps()
    _state(api, **{"spec.json": "{}"})
    store, _ = _store(api)
    assert store.read_ledger() == ""
    lines = [_line(c, s) for c in range(8) for s in range(60)]
    for i, line in enumerate(lines):
        before = api.sent["patch"] + api.sent["create"]
        store.append_ledger(line, {PROGRESS_KEY: json.dumps({"batch": i})})
        # A batch costs its own lines; a merge, the state's chunks once more (gzip).
        assert api.sent["patch"] + api.sent["create"] - before < 2 * job_state.HOT_BUDGET
        # The state, rewritten in etcd at every batch, stays small.
        assert _hot_size(api.objects[STATE]) <= job_state.HOT_BUDGET
        assert all(config_map_size(o) <= job_state.BUDGET for o in api.objects.values())
    names = sorted(api.objects, key=lambda n: (len(n), n))
    assert names[0] == STATE
    assert len(names) >= 3, "never rolled over"
    assert names[1:] == [f"{STATE}-c{i}" for i in range(1, len(names))]
    chunk = api.objects[f"{STATE}-c1"]
    assert chunk["metadata"]["labels"][CHUNK_OF_LABEL] == STATE
    assert chunk["metadata"]["ownerReferences"][0]["uid"] == "u1"
    # Merged: far fewer keys than batches.
    keys = sum(len(o.get("binaryData") or {}) for o in api.objects.values())
    assert keys < len(lines) / 4
    assert json.loads(api.objects[STATE]["data"][PROGRESS_KEY]) == {"batch": len(lines) - 1}
    # A new pod reads it all back, in order; and appends after it.
    again, _ = _store(api)
    assert again.read_ledger() == "".join(lines)
    again.append_ledger(_line(99, 0))
    assert StateStore(STATE, NS, api=api).read_ledger() == "".join(lines) + _line(99, 0)


def test_a_gzip_bomb_in_the_state_is_refused_by_the_job_not_inflated() -> None:
    """A chunk that inflates past what the workflow can record (text_limit) stops the Job's
    read with LedgerTooLargeError, naming where, with at most the limit inflated: the Job's pod
    never holds the bomb's text."""
    bomb = base64.b64encode(gzip.compress(b"0" * (64 << 20), mtime=0)).decode("ascii")
    for where in ("state", "chunk"):
        api = bench.FakeConfigMaps()
        _state(api, **{"spec.json": "{}"})
        holder = api.objects[STATE]
        if where == "chunk":
            holder = api.objects[f"{STATE}-c1"] = {
                "metadata": {"name": f"{STATE}-c1", "namespace": NS},
                "data": {},
            }
        holder["binaryData"] = {chunk_key(0): bomb}
        with pytest.raises(
            ledgerchunks.LedgerTooLargeError,
            match=rf"{STATE}(-c1)?/.*: the ledger's text passes 100,000 bytes",
        ):
            StateStore(STATE, NS, api=api).read_ledger(limit=100_000)
        # Without the bound it is what it says it is: the bound is what refused it.
        assert len(StateStore(STATE, NS, api=api).read_ledger()) == 64 << 20


def test_the_ledger_stops_at_the_chunk_config_maps_its_role_names(
    small: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past MAX_CHUNKS the Role grants nothing: a clear error, not a 403, and no ConfigMap the
    Role does not name is created or read."""
    monkeypatch.setattr(job_state, "MAX_CHUNKS", 1)
    api = bench.FakeConfigMaps()
    _state(api)
    store, _ = _store(api)
    store.read_ledger()
    lines = [_line(c, s) for c in range(8) for s in range(60)]

    def append_all() -> None:
        for line in lines:
            store.append_ledger(line)

    with pytest.raises(
        job_state.LedgerFullError, match=r"fills 1 chunk ConfigMaps of rag-search-g1"
    ):
        append_all()
    assert sorted(api.objects) == [STATE, f"{STATE}-c1"]
    # A second chunk ConfigMap made by hand is not read either: the Role would refuse the get.
    api.objects[f"{STATE}-c2"] = {"metadata": {"name": f"{STATE}-c2"}, "data": {}}
    read = api.read_namespaced_config_map
    names: list[str] = []

    def reading(name: str, namespace: str, **kwargs: Any) -> Any:
        names.append(name)
        return read(name, namespace, **kwargs)

    monkeypatch.setattr(api, "read_namespaced_config_map", reading)
    StateStore(STATE, NS, api=api).read_ledger()
    assert names == [STATE, f"{STATE}-c1"]


def test_a_pod_that_died_after_a_merge_leaves_nothing_twice(small: None) -> None:
    api = bench.FakeConfigMaps()
    _state(api)
    store, _ = _store(api)
    store.read_ledger()
    real_patch = api.patch_namespaced_config_map

    def dying(name: str, namespace: str, body: dict[str, Any], **kw: Any) -> Any:
        # The state's PATCH that would delete the merged chunks never arrives.
        if name == STATE and None in (body.get("binaryData") or {}).values():
            raise KilledError
        return real_patch(name, namespace, body, **kw)

    api.patch_namespaced_config_map = dying  # type: ignore[method-assign]
    lines = [_line(0, s) for s in range(100)]
    written = 0

    def append_all() -> None:
        nonlocal written
        for line in lines:
            store.append_ledger(line)
            written += 1

    with pytest.raises(KilledError):
        append_all()
    assert f"{STATE}-c1" in api.objects
    api.patch_namespaced_config_map = real_patch  # type: ignore[method-assign]
    again, _ = _store(api)
    # The dying append's lines went into the chunk ConfigMap, before the state's PATCH.
    assert again.read_ledger() == "".join(lines[: written + 1])
    again.append_ledger(lines[written + 1])
    assert _hot_size(api.objects[STATE]) < job_state.HOT_BUDGET / 4  # the merged ones deleted
    assert StateStore(STATE, NS, api=api).read_ledger() == "".join(lines[: written + 2])


def test_a_create_whose_answer_was_lost_is_not_made_twice(small: None) -> None:
    api = bench.FakeConfigMaps()
    _state(api)
    store, slept = _store(api)
    store.read_ledger()
    real = api.create_namespaced_config_map
    lost: list[str] = []

    def answer_lost(namespace: str, body: dict[str, Any], **kw: Any) -> Any:
        # Every create goes through but its answer is lost; the retry gets 409 AlreadyExists.
        real(namespace, body, **kw)
        if body["metadata"]["name"] not in lost:
            lost.append(body["metadata"]["name"])
            raise urllib3.exceptions.ReadTimeoutError(None, "/", "read timed out")
        return None

    api.create_namespaced_config_map = answer_lost  # type: ignore[method-assign]
    lines = [_line(0, s) for s in range(300)]
    for line in lines:
        store.append_ledger(line)
    assert len(lost) >= 2
    assert slept
    assert sorted(api.objects, key=lambda n: (len(n), n)) == [
        STATE,
        *(f"{STATE}-c{i}" for i in range(1, len(lost) + 1)),
    ]
    assert StateStore(STATE, NS, api=api).read_ledger() == "".join(lines)


# ---------------------------------------------------------------------------- retries


def _api_error(status: int, headers: dict[str, str] | None = None) -> ApiException:
    error = bench._error(status, "Reason", f"status {status}")
    error.headers = headers
    return error


def test_transient_errors_are_retried_with_backoff() -> None:
    api = bench.FakeConfigMaps()
    _state(api)
    store, slept = _store(api)
    api.failures = [
        _api_error(503),
        _api_error(429, {"Retry-After": "3"}),
        urllib3.exceptions.ReadTimeoutError(None, "/", "read timed out"),
        ConnectionResetError("reset by peer"),
        _api_error(500),
        _api_error(502),
        _api_error(504),
    ]
    assert store.read_ledger() == ""
    assert len(slept) == 7
    assert slept[1] >= 3  # the server's Retry-After
    assert all(0 < s <= job_state.BACKOFF_CAP_S for s in slept)
    assert slept[4] > slept[0]  # backing off
    api.failures = [_api_error(409), _api_error(503)]  # a patch that lost a race: sent again
    store.append_ledger(_line(0, 0))
    assert ledger_text([api.objects[STATE]]) == _line(0, 0)


def test_transient_errors_give_up_after_the_attempts_with_the_last_one() -> None:
    api = bench.FakeConfigMaps()
    _state(api)
    store, slept = _store(api)
    api.failures = [_api_error(503)] * job_state.ATTEMPTS
    with pytest.raises(StateStoreError) as error:
        store.write({PROGRESS_KEY: "{}"})
    assert f"after {job_state.ATTEMPTS} attempts" in str(error.value)
    assert "HTTP 503" in str(error.value)
    assert STATE in str(error.value)
    assert len(slept) == job_state.ATTEMPTS - 1
    assert "StateStoreError" in job.error_line(error.value)


@pytest.mark.parametrize("status", [400, 403, 404, 422])
def test_other_client_errors_fail_at_once_with_the_reason(status: int) -> None:
    api = bench.FakeConfigMaps()
    _state(api)
    store, slept = _store(api)
    api.failures = [_api_error(status)]
    with pytest.raises(ApiException) as error:
        store.write({PROGRESS_KEY: "{}"})
    assert error.value.status == status
    assert not slept
    assert f"status {status}" in job.error_line(error.value)
    with pytest.raises(kubeapi.NotFoundError):
        StateStore("missing", NS, api=api).read()


# ---------------------------------------------------------------------------- the Job's search


def _corner_workflow(samples: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """The RAG grid's 16-configuration corner scored by replay, and its replay ConfigMap."""
    workflow = bench.rag_workflow(samples, 0.8)
    workflow["spec"]["space"] = RAG_CORNER_SPACE
    _, rows = load_rag_paper()
    values = {p["name"]: p["values"] for p in RAG_CORNER_SPACE["parameters"]}
    chosen = [r for r in rows if all(r["config"][k] in v for k, v in values.items())]
    text = "".join(json.dumps(line) + "\n" for line in build_replay_ledger(chosen, samples, 7))
    # The replay ConfigMap may hold its ledger as gzip chunks too (over 1 MiB as text).
    replay = {"metadata": {"name": bench.REPLAY, "namespace": NS}, "binaryData": {}}
    for sequence, piece in enumerate(ledgerchunks.pieces(text, 20_000)):
        replay["binaryData"][chunk_key(sequence)] = encode(piece)
    return workflow, replay


@contextlib.contextmanager
def _running(api: Any) -> Iterator[io.StringIO]:
    out = io.StringIO()
    with bench.fake_api(api), contextlib.redirect_stdout(out):
        yield out


@pytest.mark.parametrize(
    ("interval_s", "redone"),
    [
        (0.0, 1),  # every batch written: only the batch in flight is evaluated again
        (5.0, 6),  # a write at most every 5 s, a batch a second: the last 5 and the one in flight
    ],
)
def test_a_search_killed_midway_resumes_from_every_chunk_without_redoing_work(
    small: None, monkeypatch: pytest.MonkeyPatch, interval_s: float, redone: int
) -> None:
    monkeypatch.setattr(job_state, "BUDGET", 4000)
    monkeypatch.setattr(job, "FLUSH_INTERVAL_S", interval_s)
    now = [0.0]
    monkeypatch.setattr(job, "monotonic", lambda: now[0])
    workflow, replay = _corner_workflow(200)
    workflow["metadata"]["namespace"] = bench.NAMESPACE
    spec = CompoundWorkflowSpec.model_validate(workflow["spec"])
    api = bench.FakeConfigMaps()
    api.objects[bench.REPLAY] = replay
    for body in build_state_config_maps(workflow, spec):
        api.objects[body["metadata"]["name"]] = body
    state = bench.STATE

    batches: list[list[tuple[str, int]]] = []  # each batch's pairs, of both pods
    real_evaluate = job.CheckpointedEvaluator.evaluate
    after_roll_over = 0
    first_pod = [True]

    def counting(self: Any, config: Any, indices: Any) -> list[float]:
        # Some batches after the first chunk ConfigMap, so that the resume reads them all.
        nonlocal after_roll_over
        missing = self.checkpoint.ledger.lookup(config, indices)
        key = json.dumps(config, sort_keys=True)
        batch = [(key, i) for i, v in zip(indices, missing, strict=True) if v != v]
        if batch:
            batches.append(batch)
        now[0] += 1.0  # a batch takes a second
        after_roll_over += first_pod[0] and f"{state}-c1" in api.objects
        if first_pod[0] and after_roll_over == 30:
            raise KilledError  # the pod dies with this batch in flight
        return real_evaluate(self, config, indices)

    monkeypatch.setattr(job.CheckpointedEvaluator, "evaluate", counting)
    with _running(api), pytest.raises(KilledError):
        job.run_search(state, bench.NAMESPACE)
    first_pod[0] = False
    assert f"{state}-c1" in api.objects, "the first pod never rolled over"
    before_restart = ledger_text(o for n, o in api.objects.items() if n != bench.REPLAY)
    assert RESULT_KEY not in api.objects[state]["data"]
    first = len(batches)

    with _running(api) as out:
        job.run_search(state, bench.NAMESPACE)
    assert "resuming: " in out.getvalue()
    final = ledger_text(o for n, o in api.objects.items() if n != bench.REPLAY)
    assert final.startswith(before_restart)
    pairs = [
        (json.dumps(fact["config"], sort_keys=True), i)
        for fact in map(json.loads, final.splitlines())
        for i in fact["samples"]
    ]
    assert len(pairs) == len(set(pairs)), "a sample was recorded twice"
    # At most the batches of the last interval and the one in flight were asked again.
    asked_before = {p for batch in batches[:first] for p in batch}
    again = [batch for batch in batches[first:] if asked_before & set(batch)]
    assert 1 <= len(again) <= redone, again
    result = json.loads(api.objects[state]["data"][RESULT_KEY])
    assert result["sample_evals"] == len(pairs)
    assert _hot_size(api.objects[state]) <= job_state.HOT_BUDGET
    for name, obj in api.objects.items():
        if name not in (state, bench.REPLAY):
            assert config_map_size(obj) <= job_state.BUDGET


# ---------------------------------------------------------------------------- batched writes


def test_a_search_writes_its_state_once_per_interval_and_each_chunk_config_map_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A 1,000-sample search of the RAG grid's corner, a batch every 0.1 s: the state is written
    at most once per 5 s (and at the end), chunk ConfigMaps are created and never patched, and
    the state carries no more than HOT_BUDGET of ledger."""
    now = [0.0]
    monkeypatch.setattr(job, "monotonic", lambda: now[0], raising=False)
    real_evaluate = job.CheckpointedEvaluator.evaluate
    batches = [0]

    def ticking(self: Any, config: Any, indices: Any) -> list[float]:
        now[0] += 0.1
        batches[0] += 1
        return real_evaluate(self, config, indices)

    monkeypatch.setattr(job.CheckpointedEvaluator, "evaluate", ticking)
    workflow, replay = _corner_workflow(1000)
    spec = CompoundWorkflowSpec.model_validate(workflow["spec"])
    api = bench.FakeConfigMaps()
    api.objects[bench.REPLAY] = replay
    for body in build_state_config_maps(workflow, spec):
        api.objects[body["metadata"]["name"]] = body
    patched: list[str] = []
    real_patch = api.patch_namespaced_config_map

    def patch(name: str, namespace: str, body: dict[str, Any], **kw: Any) -> Any:
        patched.append(name)
        return real_patch(name, namespace, body, **kw)

    api.patch_namespaced_config_map = patch  # type: ignore[method-assign]
    with _running(api):
        job.run_search(bench.STATE, bench.NAMESPACE)
    assert RESULT_KEY in api.objects[bench.STATE]["data"]
    assert set(patched) == {bench.STATE}, "a chunk ConfigMap was written twice"
    assert batches[0] > 100
    assert len(patched) <= now[0] / job.FLUSH_INTERVAL_S + 2, (len(patched), now[0])
    assert _hot_size(api.objects[bench.STATE]) <= job_state.HOT_BUDGET


@pytest.mark.parametrize(
    "keys",
    [("ledger.0-2.jsonl.gz",), ("ledger.0-2.jsonl.gz", chunk_key(0, 2), chunk_key(1))],
    ids=["unpadded", "two-spellings-and-a-copy-inside"],
)
def test_a_chunk_key_spelled_by_hand_is_read_once_and_merged_out_under_its_own_spelling(
    keys: tuple[str, ...], small: None
) -> None:
    """A chunk key without the zero padding (a hand edit, a restore by another tool) names the
    same batches: the Job reads it, a copy of it (another spelling, a batch inside it) once,
    and a merge deletes the keys as spelled, not a padded one it never had."""
    api = bench.FakeConfigMaps()
    _state(api)
    first = [_line(0, s) for s in range(3)]
    binary = {key: encode("".join(first)) for key in keys}
    if chunk_key(1) in binary:
        binary[chunk_key(1)] = encode(first[1])
    api.objects[STATE]["binaryData"] = binary
    store, _ = _store(api)
    assert store.read_ledger() == "".join(first)
    more = [_line(1, s) for s in range(40)]
    for line in more:
        store.append_ledger(line)
    assert not set(keys) & set(api.objects[STATE].get("binaryData") or {})
    assert StateStore(STATE, NS, api=api).read_ledger() == "".join(first + more)
