"""docs/pipelines.md's client examples, run as written against a real Triton serving rag-sim:
the Python example over gRPC and over HTTP, and the curl commands, with and without a deadline,
and a deadline no configuration can meet refused as the guide says (UNAVAILABLE, HTTP 503)."""

from __future__ import annotations

import ast
import contextlib
import io
import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from ragsim import ACCURATE, FASTEST, scores_of
from tritonclient.utils import InferenceServerException

from compass.dataplane.triton import LATE_MESSAGE, TritonRouter
from compass.domain.space import config_key
from compass_dev.local_triton import LocalTriton

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "pipelines.md"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.M | re.S)
# The sample the guide's examples ask for.
SAMPLE = 3


def _block(language: str, marker: str) -> str:
    """The guide's one fenced block in ``language`` that contains ``marker``."""
    [block] = [
        body
        for lang, body in FENCE.findall(GUIDE.read_text(encoding="utf-8"))
        if lang == language and marker in body
    ]
    return block


def _python_example(url: str, protocol: str) -> str:
    code = _block("python", "InferenceServerClient")
    assert "tritonclient.grpc as tritonclient" in code
    assert '"localhost:8001"' in code
    code = code.replace("tritonclient.grpc as", f"tritonclient.{protocol} as")
    return code.replace('"localhost:8001"', json.dumps(url))


def _curl_example(triton: LocalTriton) -> str:
    script = _block("bash", "curl")
    assert script.count("localhost:8000/v2/models/router/infer") == 2
    return script.replace("localhost:8000", triton.http_url)


@pytest.fixture
def refusing(router: TritonRouter) -> Iterator[TritonRouter]:
    """Admission on: the fastest configuration takes 10 s, so a deadline already past is met
    by none (test_router_admission.py's table)."""
    slow = {config_key(ACCURATE): 10_000.0, config_key(FASTEST): 10_000.0}
    router.admission = {"quantiles_ms": slow, "fastest": config_key(FASTEST)}
    router.switch(FASTEST)
    yield router
    router.admission = None


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_the_python_example_gets_the_pipelines_reply_with_and_without_a_deadline(
    triton: LocalTriton, rag_sim_data: dict[str, Any], protocol: str
) -> None:
    url = triton.grpc_url if protocol == "grpc" else triton.http_url
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(_python_example(url, protocol), {"__name__": "guide"})
    replies = [ast.literal_eval(line) for line in printed.getvalue().splitlines()]
    expected = scores_of(rag_sim_data, FASTEST)[SAMPLE]
    assert replies == [({"sample": SAMPLE, "score": expected}, FASTEST)] * 2


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_the_python_examples_late_request_is_refused_as_the_guide_says(
    triton: LocalTriton, refusing: TritonRouter, protocol: str
) -> None:
    url = triton.grpc_url if protocol == "grpc" else triton.http_url
    namespace: dict[str, Any] = {"__name__": "guide"}
    # Its client and ask() alone: its own requests (due in 2 s) would be refused here too.
    code = _python_example(url, protocol)
    exec("\n".join(line for line in code.splitlines() if not line.startswith("print(")), namespace)
    with pytest.raises(InferenceServerException) as refused:
        namespace["ask"]({"sample": SAMPLE}, deadline_s=-1.0)
    status = "StatusCode.UNAVAILABLE" if protocol == "grpc" else "503"
    assert str(refused.value.status()) == status
    assert LATE_MESSAGE in str(refused.value)
    assert "retry later" in str(refused.value)


def test_the_curl_example_gets_the_pipelines_reply_with_and_without_a_deadline(
    triton: LocalTriton, rag_sim_data: dict[str, Any]
) -> None:
    ran = subprocess.run(
        ["bash", "-c", _curl_example(triton)], capture_output=True, text=True, timeout=60
    )
    assert ran.returncode == 0, ran.stderr
    answers = [json.loads(line) for line in ran.stdout.splitlines()]
    assert len(answers) == 2
    expected = scores_of(rag_sim_data, FASTEST)[SAMPLE]
    for answer in answers:
        assert answer["model_name"] == "router"
        outputs = {o["name"]: o for o in answer["outputs"]}
        assert {o["datatype"] for o in outputs.values()} == {"BYTES"}
        assert json.loads(outputs["RESULT"]["data"][0]) == {"sample": SAMPLE, "score": expected}
        assert json.loads(outputs["CONFIG"]["data"][0]) == FASTEST


def test_the_curl_examples_late_request_is_refused_with_503(
    triton: LocalTriton, refusing: TritonRouter
) -> None:
    script = _curl_example(triton)
    # The deadline a second in the past; each command prints its status after the body.
    assert "+ 2000000000" in script
    script = script.replace("+ 2000000000", "- 1000000000").replace(
        "-w '\\n'", "-w '\\n%{http_code}\\n'"
    )
    ran = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60)
    assert ran.returncode == 0, ran.stderr
    served, served_status, late, late_status = ran.stdout.splitlines()
    # Without a deadline (and no gate) the request is served as routed; the late one refused.
    assert served_status == "200"
    assert json.loads(served)["outputs"]
    assert late_status == "503", late
    assert "retry later" in json.loads(late)["error"]
