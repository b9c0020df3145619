"""`compass search --triton`: the search scores configurations live through the real router."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from compass.commands.main import main
from compass.dataplane.triton import TritonRouter
from compass.domain.search import SearchSettings, search
from compass.domain.space import Space, config_key
from compass_dev.local_triton import LocalTriton

SPACE = {
    "parameters": [
        {"name": "generator_model", "values": ["gemma3:12b", "llama3.2:3b"]},
        {"name": "retriever_k", "type": "integer", "values": [10, 20]},
        {"name": "reranker_k", "type": "integer", "values": [1, 3]},
        {"name": "reranker_model", "values": ["ms-marco"]},
    ],
    "constraints": ["reranker_k <= retriever_k"],
}


class _RecordedScores:
    """rag-sim's recorded scores, read from its data file: what the router must reproduce."""

    def __init__(self, data: dict[str, object]) -> None:
        configs = data["configs"]
        assert isinstance(configs, dict)
        self.configs = configs

    def evaluate(self, config: dict[str, object], sample_indices: list[int]) -> list[float]:
        scores = self.configs[config_key(config)]["scores"]
        return [float(scores[i]) for i in sample_indices]


def test_live_search_through_the_router_matches_the_recorded_scores(
    triton: LocalTriton,
    router: TritonRouter,
    rag_sim_data: dict[str, object],
    tmp_path: Path,
) -> None:
    space_file = tmp_path / "space.yaml"
    space_file.write_text(yaml.safe_dump(SPACE))
    output = tmp_path / "result.json"
    code = main(
        [
            "search",
            "--space",
            str(space_file),
            "--triton",
            triton.grpc_url,
            "--samples",
            "100",
            "--tau",
            "0.83",
            "--output",
            str(output),
        ]
    )
    assert code == 0
    live = json.loads(output.read_text())
    # The same search over the recorded scores, in memory.
    expected = search(
        Space.from_spec(SPACE),
        _RecordedScores(rag_sim_data),  # type: ignore[arg-type]
        100,
        SearchSettings(tau=0.83),  # the CLI's defaults
    )
    assert live["sample_evals"] == expected.sample_evals
    assert sorted(config_key(e["config"]) for e in live["feasible"]) == sorted(
        config_key(expected.space.config(a.index)) for a in expected.feasible
    )
    assert live["feasible"], "tau 0.83 has feasible configurations in this subspace"
    # Every evaluated batch went to the checkpoint ledger as it came back from Triton.
    ledger = output.with_suffix(".ledger.jsonl").read_text().splitlines()
    assert (
        sum(len(json.loads(line)["scores"]) for line in ledger if '"scores"' in line)
        == (live["sample_evals"])
    )
    # Searching never moved production traffic.
    assert router.infer({"sample": 0}).config == router.active_config()


def test_concurrent_live_search_gives_the_sequential_result(
    triton: LocalTriton, router: TritonRouter, tmp_path: Path
) -> None:
    """8 requests in flight over two addresses of the server: the sequential search's result."""
    space_file = tmp_path / "space.yaml"
    space_file.write_text(yaml.safe_dump(SPACE))
    results = []
    for concurrency, addresses in (
        ("1", triton.grpc_url),
        ("8", f"{triton.grpc_url},{triton.grpc_url}"),
    ):
        output = tmp_path / f"result-{concurrency}.json"
        code = main(
            [
                "search",
                "--space",
                str(space_file),
                "--triton",
                addresses,
                "--samples",
                "100",
                "--tau",
                "0.83",
                "--concurrency",
                concurrency,
                "--output",
                str(output),
            ]
        )
        assert code == 0
        results.append(json.loads(output.read_text()))
    assert results[0]["feasible"], "tau 0.83 has feasible configurations in this subspace"
    assert results[1] == results[0]


def test_the_default_concurrency_is_the_addresses_times_the_routers_instances(
    triton: LocalTriton, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    space_file = tmp_path / "space.yaml"
    space_file.write_text(yaml.safe_dump(SPACE))
    output = tmp_path / "result.json"
    addresses = ",".join([triton.grpc_url] * 3)
    args = ["search", "--space", str(space_file), "--triton", addresses, "--samples", "100"]
    assert main([*args, "--tau", "0.83", "--output", str(output)]) == 0
    # The router's instances as Triton loaded them (the model config it serves).
    instances = sum(
        int(group.get("count") or 1)
        for group in TritonRouter(triton.grpc_url).model_config()["instance_group"]
    )
    note = f"concurrency {3 * instances} (auto: 3 address(es) x {instances} router instance(s))"
    assert note in capsys.readouterr().err
    assert json.loads(output.read_text())["feasible"]
