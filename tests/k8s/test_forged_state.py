"""A tenant's forged state ConfigMaps, on a real API server: ten of 255 KiB gzip each (some
256 MiB of text apiece), labelled as the workflow's and owned by it, cost the operator no more
than its own bound, and the workflow's LedgerRead condition names what was refused; one made
under the name of the next generation's state is refused, never adopted."""

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
    workflow: dict[str, Any],
    name: str,
    generation: int,
    bomb: str | None,
    of: str | None = None,
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
        **({"binaryData": {chunk_key(0 if of is None else 1): bomb}} if bomb else {}),
        "data": {"made-by": "a tenant"},
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
        # A chunk past the most a state may have and a chunk of no state.
        forged.append(_forged(workflow, "forged-search-g1-c999", 1, bomb, of="forged-search-g1"))
        forged.append(_forged(workflow, "forged-search-g1-c1", 1, bomb, of="forged-search-g9"))
        for config_map in forged:
            flows.core.create_namespaced_config_map(
                k8s_namespace, config_map, _preload_content=False
            )
        # And the operator's own state, which a tenant who may write ConfigMaps can edit.
        flows.core.patch_namespaced_config_map(
            "forged-search-g1",
            k8s_namespace,
            {"binaryData": {chunk_key(0): bomb}},
            _preload_content=False,
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
    assert "the ledger of generation 1 (forged-search-g1) is not carried over" in message
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


def test_a_state_made_under_the_next_generations_name_is_refused_not_adopted(
    k8s_api: Any,
    k8s_namespace: str,
    crds: None,
    operator_env: dict[str, str],  # noqa: F811
) -> None:
    flows = Workflows(k8s_api, k8s_namespace)
    with operator(k8s_namespace):
        workflow = flows.create(_workflow("taken", tau=0.8))
        flows.wait(
            "taken",
            lambda w: (w.get("status") or {}).get("observedGeneration") == 1,
            30,
            "generation 1 to start",
        )
        own = flows.state_config_map("taken")["metadata"]["uid"]
        assert flows.get("taken")["status"]["ledgerConfigMapUid"] == own
        # Labelled and owned as the operator makes its states, a name and a generation ahead.
        flows.core.create_namespaced_config_map(
            k8s_namespace, _forged(workflow, "taken-search-g2", 2, None), _preload_content=False
        )
        forged = flows.core.read_namespaced_config_map("taken-search-g2", k8s_namespace)
        flows.patch_spec("taken", {"evaluation": {"tau": 0.81}})
        refused = flows.wait(
            "taken",
            lambda w: (
                (flows.condition("taken", "LedgerRead") or {}).get("reason") == "StateNameTaken"
            ),
            30,
            "generation 2 to refuse the ConfigMap under its state's name",
        )
        assert refused is not None
        condition = flows.condition("taken", "LedgerRead")
        assert condition is not None
        assert condition["status"] == "False"
        assert "ConfigMap taken-search-g2" in condition["message"]
        assert "delete it" in condition["message"]
        status = flows.get("taken")["status"]
        # Not started on it: still generation 1's state, and the forged one is as it was made.
        assert (status["observedGeneration"], status["ledgerConfigMapUid"]) == (1, own)
        after = flows.core.read_namespaced_config_map("taken-search-g2", k8s_namespace)
        assert after.data == {"made-by": "a tenant"}
        assert after.metadata.resource_version == forged.metadata.resource_version
        # Deleted, the operator makes its own and starts the generation on it.
        flows.core.delete_namespaced_config_map("taken-search-g2", k8s_namespace)
        flows.wait(
            "taken",
            lambda w: (w.get("status") or {}).get("observedGeneration") == 2,
            60,
            "generation 2 to start once the name is free",
        )
        state = flows.core.read_namespaced_config_map("taken-search-g2", k8s_namespace)
        assert state.metadata.uid != forged.metadata.uid
        assert "made-by" not in (state.data or {})
        assert flows.get("taken")["status"]["ledgerConfigMapUid"] == state.metadata.uid
