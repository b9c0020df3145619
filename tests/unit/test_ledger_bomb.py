"""A chunk ConfigMap carrying a gzip bomb (labelled and owned like a ledger chunk) is refused
after inflating no more than the workflow's own bound, and never carried into the next
generation; ConfigMaps not named as the operator names its states are never read, and of its
states only one is. The bombs are real: zeros, gzip, well under a chunk's 900 KiB."""

from __future__ import annotations

import base64
import gzip
import tracemalloc
import zlib
from typing import Any

import pytest

from compass.api.compoundworkflow import CompoundWorkflowStatus, Phase, WorkflowConditionType
from compass.controllers.builders import LEDGER_KEY
from compass.controllers.conditions import find_condition
from compass.controllers.ledgerbudget import LedgerBudget, LedgerBudgetBusyError
from compass.controllers.ledgerchunks import (
    BUDGET,
    CHUNK_OF_LABEL,
    LedgerTooLargeError,
    chunk_key,
    encode,
    ledger_text,
    stored_size,
    text_limit,
)
from compass.controllers.workflow_state import (
    refusal_message,
    seedable,
    state_to_read,
    stored_states,
)
from compass.controllers.workflow_status import (
    ledger_unread_status,
    summarized,
    workflow_condition,
)

BOMB_BYTES = 128 * 1024 * 1024
# A small workflow: 12 configurations of 200 samples may record about 350 KiB of ledger.
CONFIGURATIONS, SAMPLES = 12, 200


def _bomb() -> str:
    """BOMB_BYTES of zeros as a gzip binaryData value, made a piece at a time."""
    packer = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    piece = bytes(1024 * 1024)
    packed = b"".join(packer.compress(piece) for _ in range(BOMB_BYTES // len(piece)))
    return base64.b64encode(packed + packer.flush()).decode("ascii")


@pytest.fixture(scope="module")
def bomb() -> str:
    value = _bomb()
    assert stored_size(value) < BUDGET  # it fits a chunk ConfigMap, as the attack's did
    return value


def _config_map(
    name: str, binary: dict[str, str], of: str | None = None, generation: int = 2
) -> dict[str, Any]:
    labels = {"compass.io/workflow": "w", "compass.io/generation": str(generation)}
    labels |= {CHUNK_OF_LABEL: of} if of else {}
    return {"metadata": {"name": name, "labels": labels}, "data": {}, "binaryData": binary}


def _peak(call: Any) -> tuple[Any, int]:
    """What ``call`` returned or raised, and the most memory Python held during it."""
    tracemalloc.start()
    try:
        try:
            result: Any = call()
        except LedgerTooLargeError as error:
            result = error
        return result, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_a_gzip_bomb_is_refused_having_inflated_no_more_than_the_bound(bomb: str) -> None:
    limit = text_limit(CONFIGURATIONS, SAMPLES)
    assert limit < 4 * 1024 * 1024
    state = _config_map("w-search-g2", {chunk_key(0): encode('{"config": {}}\n')})
    chunk = _config_map("w-search-g2-c1", {chunk_key(1): bomb}, of="w-search-g2")
    error, peak = _peak(lambda: ledger_text([state, chunk], limit))
    assert isinstance(error, LedgerTooLargeError), error
    assert "w-search-g2-c1/" in str(error)  # names the ConfigMap that carries it
    assert peak < 4 * limit, f"{peak:,} bytes held to refuse a {limit:,}-byte bound"


def test_the_bomb_generation_is_refused_and_never_seeds_the_next(bomb: str) -> None:
    good = "".join(
        f'{{"config": {{"k": {i}}}, "samples": [0], "scores": [1.0]}}\n' for i in range(5)
    )
    items = [
        _config_map("w-search-g1", {chunk_key(0): encode(good)}, generation=1),
        _config_map("w-search-g2", {chunk_key(0): encode(good)}),
        _config_map("w-search-g2-c1", {chunk_key(1): bomb}, of="w-search-g2"),
    ]
    listing, peak = _peak(
        lambda: stored_states(items, "w", _generation, 2, text_limit(CONFIGURATIONS, SAMPLES))
    )
    assert peak < 32 * 1024 * 1024
    states = listing.states
    assert not states[1].read
    assert states[1].names == ("w-search-g1",)
    refused = states[2]
    assert refused.refused is not None
    assert "w-search-g2-c1/" in refused.refused
    assert LEDGER_KEY not in refused.data
    assert refused.names == ("w-search-g2", "w-search-g2-c1")  # still deleted with its generation
    # Generation 3 may seed from neither: nothing of the bomb is copied forward.
    assert seedable(states) == {}
    message = refusal_message("w", listing)
    assert message is not None
    assert "generation 2 (w-search-g2)" in message


def _generation(item: dict[str, Any]) -> int:
    return int(item["metadata"]["labels"].get("compass.io/generation", "0"))


def test_the_previous_generation_seeds_the_next() -> None:
    good = '{"config": {"k": 1}, "samples": [0], "scores": [1.0]}\n'
    items = [
        _config_map("w-search-g1", {chunk_key(0): encode(good)}, generation=1),
        _config_map("w-search-g2", {chunk_key(0): encode(good)}, generation=2),
    ]
    names = [i["metadata"]["name"] for i in items]
    # Generation 3's start reads the state its status recorded, and no other.
    assert state_to_read(names, "w", 3, "w-search-g2") == 2
    listing = stored_states(items, "w", _generation, 2)
    assert listing.states[2].data[LEDGER_KEY] == good
    assert not listing.states[1].read
    assert set(seedable(listing.states)) == {2}
    # Its own state, once made, is what it reads; a recorded name not of an earlier generation
    # of this workflow, or not there, reads nothing.
    assert state_to_read([*names, "w-search-g3"], "w", 3, "w-search-g2") == 3
    assert state_to_read(names, "w", 3, None) is None
    assert state_to_read(names, "w", 3, "x-search-g2") is None
    assert state_to_read(names, "w", 2, "w-search-g2") == 2
    assert state_to_read(["w-search-g1"], "w", 3, "w-search-g2") is None
    assert state_to_read(["w-search-g2"], "w", 1, "w-search-g2") is None  # a later one


# A forged state: 255 KiB of gzip (under a ConfigMap's limit) that inflates to some 255 MiB.
FORGED_GZIP = 255 * 1024


@pytest.fixture(scope="module")
def big_bomb() -> str:
    packer = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    piece = bytes(1024 * 1024)
    packed = b""
    while len(packed) < FORGED_GZIP - 1024:
        packed += packer.compress(piece)
    return base64.b64encode(packed + packer.flush()).decode("ascii")


def test_ten_forged_states_cost_no_more_than_one_bounded_ledger(big_bomb: str) -> None:
    """Ten ConfigMaps with the workflow's labels (and its ownerReference, as the lister
    checks), each 255 KiB of gzip: the names the operator gives its states are the only ones
    read, and of those only the generation asked for, within the operator's bound."""
    forged = [
        _config_map(f"w-search-g{g}-forged", {chunk_key(0): big_bomb}, generation=g)
        for g in range(1, 5)
    ] + [
        _config_map("w-search-g5-c1", {chunk_key(1): big_bomb}, of="w-search-g9"),
        _config_map("w-search-g5-c999", {chunk_key(1): big_bomb}, of="w-search-g5"),
        _config_map("w-search-g7", {chunk_key(0): big_bomb}, generation=7),
        _config_map("w-search-g8", {chunk_key(0): big_bomb}, generation=8),
        _config_map("w-search-g6", {chunk_key(0): big_bomb}, generation=6),
        _config_map("w-search-g5", {chunk_key(0): big_bomb}, generation=5),
    ]
    assert len(forged) == 10
    limit = 32 * 1024 * 1024  # the chart's ledger.textLimitMiB
    listing, peak = _peak(lambda: stored_states(forged, "w", _generation, 5, limit))
    assert peak < 3 * limit, f"{peak:,} bytes held to refuse ten forged states"
    assert listing.foreign == (
        "w-search-g1-forged",
        "w-search-g2-forged",
        "w-search-g3-forged",
        "w-search-g4-forged",
        "w-search-g5-c1",
        "w-search-g5-c999",
    )
    assert listing.states[5].refused is not None
    assert [g for g, s in listing.states.items() if s.read] == [5]
    message = refusal_message("w", listing)
    assert message is not None
    assert "w-search-g1-forged" in message
    assert "and 1 more" in message
    assert "generation 5 (w-search-g5)" in message


def test_the_budget_across_workflows_holds() -> None:
    budget = LedgerBudget(100)
    with budget.reserve(60):
        with pytest.raises(LedgerBudgetBusyError, match="60 of the 100-byte"), budget.reserve(50):
            pass
        with budget.reserve(40):
            assert budget.held == 100
    assert budget.held == 0
    with budget.reserve(10**9):  # one workflow's bound past the budget still fits an idle one
        assert budget.held == 100


def test_a_ledger_within_the_bound_reads_as_before() -> None:
    text = "".join(
        f'{{"config": {{"k": {i}}}, "samples": [1], "scores": [0.5]}}\n' for i in range(99)
    )
    # Two gzip members in one value (concatenated), as gzip.decompress reads them too.
    two = base64.b64encode(gzip.compress(b"a\n") + gzip.compress(b"b\n")).decode("ascii")
    state = _config_map("s", {chunk_key(0): encode(text), chunk_key(1): two})
    limit = text_limit(1, 1)
    assert ledger_text([state], limit) == ledger_text([state]) == text + "a\nb\n"
    with pytest.raises(LedgerTooLargeError):
        ledger_text([state], len(text))  # one byte short of the whole


def test_the_bound_grows_with_the_workflow_and_is_capped() -> None:
    assert text_limit(1, 1) == 1024 * 1024
    assert text_limit(1000, 1000) > text_limit(100, 1000) > text_limit(100, 100)
    assert text_limit(2_000_000, 10_000_000) == 256 * 1024 * 1024


def test_listed_by_metadata_only_the_read_state_is_fetched_and_no_more_than_its_bound(
    big_bomb: str,
) -> None:
    """As the operator lists them (metadata alone): the read state's ConfigMaps are fetched one
    at a time, and the fetching stops once what they store passes the bound."""
    good = '{"config": {"k": 1}, "samples": [0], "scores": [1.0]}\n'
    whole = [
        _config_map("w-search-g1", {chunk_key(0): big_bomb}, generation=1),
        _config_map("w-search-g2", {chunk_key(0): encode(good)}),
        *(
            _config_map(f"w-search-g2-c{i}", {chunk_key(i): big_bomb}, of="w-search-g2")
            for i in range(1, 17)
        ),
    ]
    by_name = {c["metadata"]["name"]: c for c in whole}
    fetched: list[str] = []

    def fetch(name: str) -> dict[str, Any] | None:
        fetched.append(name)
        return by_name.get(name)

    listed = [{"metadata": c["metadata"]} for c in whole]
    limit = 1024 * 1024  # 1 MiB, and 1 MiB of room for the state's own keys
    listing, peak = _peak(lambda: stored_states(listed, "w", _generation, 2, limit, fetch))
    refused = listing.states[2]
    assert refused.refused is not None
    assert "store more than 1,048,576 bytes" in refused.refused
    # In order, and no further than the chunk that passed 2 MiB stored (the 8th, of 255 KiB).
    assert fetched == ["w-search-g2", *sorted(f"w-search-g2-c{i}" for i in range(1, 17))][:9]
    assert peak < 8 * 1024 * 1024
    # Within the bound, a fetched state reads as a listed one.
    fetched.clear()
    small = stored_states(listed[:2], "w", _generation, 2, limit, fetch)
    assert small.states[2].data[LEDGER_KEY] == good
    assert fetched == ["w-search-g2"]


def test_the_refusal_is_a_condition_and_never_why_a_generation_failed() -> None:
    now = "2026-01-01T00:00:00Z"
    refused = ledger_unread_status(CompoundWorkflowStatus(), "ConfigMaps x: not read", 2, now)
    read = find_condition(refused.conditions, WorkflowConditionType.LEDGER_READ)
    assert read is not None
    assert (read.status, read.reason, read.message) == (
        "False",
        "StateRefused",
        "ConfigMaps x: not read",
    )
    failing = workflow_condition(
        WorkflowConditionType.SEARCH_SUCCEEDED, "False", "JobFailed", "the pod failed", 2
    )
    failed = refused.model_copy(
        update={"phase": Phase.FAILED, "conditions": [*refused.conditions, failing]}
    )
    ready = find_condition(summarized(failed, 2, now).conditions, WorkflowConditionType.READY)
    assert ready is not None
    assert (ready.status, ready.reason) == ("False", "JobFailed")
