"""The Jobs' state ConfigMap: StateStore reads the spec and ledger and writes them back.

The state holds the workflow spec frozen at one generation, the search ledger, and what each
Job reports (progress, results). Ledger lines are appended as gzip chunks
(compass.controllers.ledgerchunks): a PATCH carries the new lines only, and once the state's
chunks would pass HOT_BUDGET they move out into chunk ConfigMaps, each created once and never
written again.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from compass.controllers import kubeapi
from compass.controllers.builders import build_ledger_chunk
from compass.controllers.ledgerchunks import (
    BUDGET,
    HOT_BUDGET,
    MAX_CHUNKS,
    LedgerTooLargeError,
    chunk_key,
    chunk_name,
    decode,
    encode,
    ledger_chunks,
    ledger_text,
    pieces,
    stored_size,
)

# A state read or write is retried on these answers (an API server restarting, overloaded or
# behind a proxy that lost it): a search of hours must not fail on one blip, and a pod retry
# would read the whole ledger again. Any other 4xx (a 403 of a Role without create, a 422 of a
# ConfigMap too large) fails at once with the server's reason: retrying it changes nothing.
TRANSIENT_STATUSES = frozenset({429, 500, 502, 503, 504})
ATTEMPTS = 8
BACKOFF_S = 0.5  # doubling, capped: up to about 45 s of retries, an API server restart
BACKOFF_CAP_S = 15.0
_MERGE_PATCH = "application/merge-patch+json"


class StateStoreError(Exception):
    """A state read or write that still failed, transiently, after every attempt."""


class LedgerFullError(Exception):
    """The ledger would need more chunk ConfigMaps than the Jobs' Role names."""


def _transient(error: BaseException, conflict: bool) -> bool:
    if isinstance(error, ApiException):
        return error.status in TRANSIENT_STATUSES or (conflict and error.status == 409)
    return True  # no answer: refused, reset or timed out (kubeapi.ERRORS)


def _delay(attempt: int, error: BaseException) -> float:
    """Exponential backoff with jitter, at least the server's Retry-After."""
    # The jitter: the pods of many workflows must not retry in step.
    headers = getattr(error, "headers", None) or {}
    try:
        after = float(headers.get("Retry-After", 0))
    except (TypeError, ValueError):
        after = 0.0
    backoff = BACKOFF_S * 2**attempt * random.uniform(0.5, 1.0)
    return float(min(BACKOFF_CAP_S, max(after, backoff)))


@dataclass
class _Hot:
    """A chunk in the state itself: its batches and text (merged out with the others)."""

    first: int
    last: int
    key: str  # as the state spells it: a merge deletes this key
    text: str
    size: int


class StateStore:
    """The state ConfigMap and its ledger chunks, each call retried on transient errors."""

    # Calls go through compass.controllers.kubeapi, so with its request timeout: a pod must
    # fail, and be retried, rather than hang on a lost API server.

    def __init__(
        self,
        name: str,
        namespace: str,
        api: Any = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if api is None:
            api = client.CoreV1Api(kubeapi.load_client())
        self.api = api
        self.name = name
        self.namespace = namespace
        self.sleep = sleep
        self._state: dict[str, Any] | None = None
        self._opened = False  # the ledger read, so appends know where they go
        self._chunks = 0  # how many chunk ConfigMaps the ledger fills
        self._hot: list[_Hot] = []  # the chunks in the state, in order
        self._moved: list[str] = []  # state chunks merged out, for the next PATCH to delete
        self._next = 0  # the next batch's number

    def _call(self, what: str, method: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """kubeapi.call, retried on transient errors (409 too, unless conflict=False)."""
        conflict = kwargs.pop("conflict", True)
        for attempt in range(ATTEMPTS):
            try:
                return kubeapi.call(method, *args, **kwargs)
            except kubeapi.ERRORS as error:
                if not _transient(error, conflict):
                    raise
                if attempt + 1 == ATTEMPTS:
                    raise StateStoreError(
                        f"{what}: still failing after {ATTEMPTS} attempts: "
                        f"{kubeapi.describe(error)}"
                    ) from error
                self.sleep(_delay(attempt, error))
        raise AssertionError("unreachable")

    def _get(self, name: str) -> dict[str, Any]:
        """A ConfigMap of this namespace; the server's NotFoundError if it does not exist."""
        found: dict[str, Any] = self._call(
            f"reading ConfigMap {name}", self.api.read_namespaced_config_map, name, self.namespace
        )
        return found

    def _read(self, name: str) -> dict[str, Any] | None:
        try:
            return self._get(name)
        except kubeapi.NotFoundError:
            return None

    def read(self) -> dict[str, str]:
        """The state ConfigMap's data (the server's NotFoundError, its words in the pod's last
        line, if it does not exist)."""
        found = self._get(self.name)
        self._state = found
        return dict(found.get("data") or {})

    def read_ledger(self, limit: int | None = None) -> str:
        """The ledger of the state and its chunk ConfigMaps; later appends go after it. Past
        ``limit`` bytes of text (what the workflow can record: ledgerchunks.text_limit),
        LedgerTooLargeError, with no more than that inflated (a gzip bomb in a chunk)."""
        if self._state is None:
            self.read()
        assert self._state is not None
        found = [self._state]
        # By name, one after the other until one is missing: the Role needs no list verb (and
        # names MAX_CHUNKS of them, no more).
        while len(found) <= MAX_CHUNKS and (chunk := self._read(chunk_name(self.name, len(found)))):
            found.append(chunk)
        self._chunks = len(found) - 1
        spans = [(first, last) for obj in found[1:] for first, last, *_ in ledger_chunks(obj)]
        self._hot, self._moved = [], []
        for first, last, key, value in sorted(ledger_chunks(self._state)):
            if any(a <= first and last <= b for a, b in spans):
                self._moved.append(key)  # merged out by a pod that died before deleting it
            else:
                spans.append((first, last))  # a copy inside it (a key spelled twice) is moved
                try:
                    text = decode(value, limit)
                except LedgerTooLargeError:
                    raise LedgerTooLargeError(
                        f"{self.name}/{key}: the ledger's text passes {limit:,} bytes"
                    ) from None
                self._hot.append(_Hot(first, last, key, text, stored_size(value)))
        self._next = 1 + max((span[1] for obj in found for span in ledger_chunks(obj)), default=-1)
        self._opened = True
        return ledger_text(found, limit)

    def write(self, data: Mapping[str, str | None]) -> None:
        """Patch these keys of the state, a None deleting its key (and delete the chunks
        merged out of it)."""
        self._patch(self.name, {"data": dict(data), **self._deletions()})
        self._moved = []

    def _deletions(self) -> dict[str, Any]:
        return {"binaryData": dict.fromkeys(self._moved)} if self._moved else {}

    def _patch(self, name: str, body: Mapping[str, Any]) -> None:
        self._call(
            f"patching ConfigMap {name}",
            self.api.patch_namespaced_config_map,
            name,
            self.namespace,
            body,
            _content_type=_MERGE_PATCH,
        )

    def append_ledger(self, text: str, data: Mapping[str, str] | None = None) -> None:
        """Append ledger lines (and these keys of the state) in one PATCH, as one more chunk of
        the state or, past HOT_BUDGET, with the state's chunks merged out first (_merge_out)."""
        if not self._opened:
            self.read_ledger()
        value = encode(text)
        size = stored_size(value)
        body: dict[str, Any] = {}
        if sum(h.size for h in self._hot) + size > HOT_BUDGET:
            # etcd stores the whole state at every write: it keeps no more than HOT_BUDGET.
            self._merge_out(text)
        else:
            key = chunk_key(self._next)
            body["binaryData"] = {key: value}
            self._hot.append(_Hot(self._next, self._next, key, text, size))
        deletions = self._deletions().get("binaryData", {})
        if deletions:
            body["binaryData"] = {**deletions, **body.get("binaryData", {})}
        if data:
            body["data"] = dict(data)
        if body:
            self._patch(self.name, body)
        self._moved = []
        self._next += 1

    def _merge_out(self, text: str) -> None:
        """The state's chunks and ``text`` (the next batch) as one gzip in a new chunk ConfigMap:
        written once, so etcd stores it once (a chunk ConfigMap patched as it grew would be
        stored whole at every merge)."""
        # The state's chunks are deleted by the PATCH that follows: a pod that dies between the
        # two leaves them in both, and the reader skips the copy whose batches are covered.
        first = self._hot[0].first if self._hot else self._next
        merged = "".join(h.text for h in self._hot) + text
        value = encode(merged)
        if stored_size(value) <= BUDGET:
            self._create_chunk(self._chunks + 1, chunk_key(first, self._next), value)
        else:  # more than one ConfigMap takes: in pieces, each numbered after the last
            for number, piece in enumerate(pieces(merged)):
                key = chunk_key(first, self._next) if number == 0 else chunk_key(self._next)
                self._create_chunk(self._chunks + 1, key, encode(piece))
                self._next += 1
            self._next -= 1
        self._moved += [h.key for h in self._hot]
        self._hot = []

    def _create_chunk(self, index: int, key: str, value: str) -> None:
        """Create the index-th chunk ConfigMap holding this chunk."""
        assert self._state is not None
        if index > MAX_CHUNKS:
            raise LedgerFullError(
                f"the search ledger fills {MAX_CHUNKS} chunk ConfigMaps of {self.name}, the most "
                "its Role grants: search fewer samples (evaluation.samples) or a smaller space"
            )
        body = build_ledger_chunk(self._state, index, {key: value})
        name = body["metadata"]["name"]
        try:
            self._call(
                f"creating ConfigMap {name}",
                self.api.create_namespaced_config_map,
                self.namespace,
                body,
                conflict=False,
            )
        except kubeapi.ConflictError:
            existing = self._read(name)
            if existing is None:  # deleted meanwhile: create it again
                return self._create_chunk(index, key, value)
            if (existing.get("binaryData") or {}).get(key) != value:
                # Not our create answered late but another writer's ConfigMap: keep it, and
                # put this chunk after it.
                self._chunks += 1
                return self._create_chunk(index + 1, key, value)
        self._chunks += 1
        return None
