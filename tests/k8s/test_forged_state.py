"""A tenant's forged state ConfigMaps, on a real API server: ten of 255 KiB gzip each (some
256 MiB of text apiece), labelled as the workflow's and owned by it, cost the operator no more
than its own bound, and the workflow's LedgerRead condition names what was refused."""

from __future__ import annotations

import base64
import tracemalloc
import zlib
from typing import Any

from e2e_shared import Workflows
from test_workflow_controller import _workflow, operator, operator_env  # noqa: F401

from compass.controllers import kubeapi
from compass.controllers.builders import GENERATION_LABEL, WORKFLOW_LABEL
from compass.controllers.ledgerchunks import CHUNK_OF_LABEL, chunk_key, text_limit

FORGED_GZIP = 255 * 1024
# The workflow's own bound would let each forged ledger inflate to 256 MiB: 16 configurations
# of this many samples.
SAMPLES = 300_000
MIB = 1024 * 1024


def _bomb() -> str:
    """Some 255 KiB of gzip that inflates to about 256 MiB of zeros."""
    packer = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    piece = bytes(MIB)
    packed = b""
    while len(packed) < FORGED_GZIP - 1024:
        packed += packer.compress(piece)
    return base64.b64encode(packed + packer.flush()).decode("ascii")


def _forged(
    workflow: dict[str, Any], name: str, generation: int, bomb: str, of: str | None = None
) -> dict[str, Any]:
    """A ConfigMap as a tenant can make it: the workflow's labels, its ownerReference."""
    metadata = workflow["metadata"]
    labels = {WORKFLOW_LABEL: metadata["name"], GENERATION_LABEL: str(generation)}
    owner = {
        "apiVersion": workflow["apiVersion"],
        "kind": workflow["kind"],
        "name": metadata["name"],
        "uid": metadata["uid"],
        "controller": True,
    }
    return {
        "metadata": {
            "name": name,
            "labels": labels | ({CHUNK_OF_LABEL: of} if of else {}),
            "ownerReferences": [owner],
        },
        "binaryData": {chunk_key(0 if of is None else 1): bomb},
    }


def test_ten_forged_gzip_states_are_refused_within_the_operators_bound(
    k8s_api: Any,
    k8s_namespace: str,
    crds: None,
    operator_env: dict[str, str],  # noqa: F811
) -> None:
    flows = Workflows(k8s_api, k8s_namespace)
    body = _workflow("forged", tau=0.8, samples=SAMPLES)
    assert text_limit(16, SAMPLES) == 256 * MIB  # what the spec alone would allow per state
    bomb = _bomb()
    with operator(k8s_namespace):
        workflow = flows.create(body)
        flows.wait(
            "forged",
            lambda w: (w.get("status") or {}).get("observedGeneration") == 1,
            30,
            "generation 1 to start",
        )
        names = [f"forged-search-g1-copy{i}" for i in range(7)]
        forged = [_forged(workflow, name, 1, bomb) for name in names]
        # A chunk past the most a state may have, a chunk of no state, and the name the
        # operator will give generation 2's state, made before it does.
        forged.append(_forged(workflow, "forged-search-g1-c999", 1, bomb, of="forged-search-g1"))
        forged.append(_forged(workflow, "forged-search-g1-c1", 1, bomb, of="forged-search-g9"))
        forged.append(_forged(workflow, "forged-search-g2", 2, bomb))
        for config_map in forged:
            flows.core.create_namespaced_config_map(
                k8s_namespace, config_map, _preload_content=False
            )
        tracemalloc.start()
        try:
            flows.patch_spec("forged", {"evaluation": {"tau": 0.81}})
            refused = flows.wait(
                "forged",
                lambda w: (
                    (w.get("status") or {}).get("observedGeneration") == 2
                    and flows.condition("forged", "LedgerRead")
                ),
                60,
                "generation 2 to start and say what it refused",
            )
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    assert refused is not None
    condition = flows.condition("forged", "LedgerRead")
    assert condition is not None
    assert (condition["status"], condition["reason"]) == ("False", "StateRefused")
    message = condition["message"]
    assert "forged-search-g1-c1, forged-search-g1-c999, forged-search-g1-copy0" in message
    assert "and 4 more" in message
    assert "the ledger of generation 2 (forged-search-g2) is not carried over" in message
    assert "33,554,432 bytes" in message  # the chart's default per-workflow bound, 32 MiB
    assert peak < 512 * MIB, f"the operator held {peak / MIB:.0f} MiB for ten forged states"
    # Not the operator's to delete: the foreign ones are left where the tenant made them.
    left = {c["metadata"]["name"] for c in flows.config_maps("forged")}
    assert set(names) <= left
    # The operator lists them as this server answers: names, labels and owners, no data.
    listed = kubeapi.list_metadata(
        flows.core.list_namespaced_config_map,
        k8s_namespace,
        label_selector=f"{WORKFLOW_LABEL}=forged",
    )
    assert {i["metadata"]["name"] for i in listed} == left
    assert all(set(i) <= {"kind", "apiVersion", "metadata"} for i in listed), listed[0].keys()
