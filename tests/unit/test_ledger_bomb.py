"""A chunk ConfigMap carrying a gzip bomb (labelled and owned like a ledger chunk) is refused
after inflating no more than the workflow's own bound, and never carried into the next
generation. The bomb is real: 128 MiB of zeros, gzip, well under a chunk's 900 KiB."""

from __future__ import annotations

import base64
import gzip
import tracemalloc
import zlib
from typing import Any

import pytest

from compass.controllers.builders import LEDGER_KEY
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
from compass.controllers.workflow_state import seedable, stored_states

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


def _config_map(name: str, binary: dict[str, str], of: str | None = None) -> dict[str, Any]:
    labels = {"compass.io/workflow": "w"} | ({CHUNK_OF_LABEL: of} if of else {})
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
    state = _config_map("w-g2", {chunk_key(0): encode('{"config": {}}\n')})
    chunk = _config_map("w-g2-c1", {chunk_key(1): bomb}, of="w-g2")
    error, peak = _peak(lambda: ledger_text([state, chunk], limit))
    assert isinstance(error, LedgerTooLargeError), error
    assert "w-g2-c1/" in str(error)  # names the ConfigMap that carries it
    assert peak < 4 * limit, f"{peak:,} bytes held to refuse a {limit:,}-byte bound"


def test_the_bomb_generation_is_refused_and_never_seeds_the_next(bomb: str) -> None:
    good = "".join(
        f'{{"config": {{"k": {i}}}, "samples": [0], "scores": [1.0]}}\n' for i in range(5)
    )
    items = [
        _config_map("w-g1", {chunk_key(0): encode(good)}),
        _config_map("w-g2", {chunk_key(0): encode(good)}),
        _config_map("w-g2-c1", {chunk_key(1): bomb}, of="w-g2"),
    ]
    states, peak = _peak(
        lambda: stored_states(
            items,
            lambda item: int(item["metadata"]["name"][3]),
            text_limit(CONFIGURATIONS, SAMPLES),
        )
    )
    assert peak < 32 * 1024 * 1024
    assert states[1].refused is None
    assert states[1].data[LEDGER_KEY] == good
    refused = states[2]
    assert refused.refused is not None
    assert "w-g2-c1/" in refused.refused
    assert LEDGER_KEY not in refused.data
    assert refused.names == ("w-g2", "w-g2-c1")  # still deleted with its generation
    # Only generation 1 may seed generation 3: nothing of the bomb is copied forward.
    assert set(seedable(states)) == {1}


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
