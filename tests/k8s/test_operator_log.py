"""`compass operator` with COMPASS_LOG_FORMAT=json (the chart's logging.format) against a real API
server: every line of its output is one JSON object, kopf's lines as well as the operator's, and
COMPASS_LOG_LEVEL sets the floor. The formatter itself: tests/unit/test_operator_logs.py.
"""

from __future__ import annotations

import json
from pathlib import Path

from cluster import Cluster
from e2e_shared import install_crds
from operator_process import Operator


def test_json_log_from_start_to_stop(
    k8s_cluster: Cluster, k8s_namespace: str, tmp_path: Path
) -> None:
    install_crds(k8s_cluster)  # an operator waiting for its CRDs is another test's subject
    log = tmp_path / "operator.log"
    operator = Operator(
        k8s_cluster,
        k8s_namespace,
        log,
        env={"COMPASS_LOG_FORMAT": "json", "COMPASS_LOG_LEVEL": "info"},
        verbose=False,
    )
    operator.start()
    operator.stop()
    lines = log.read_text().splitlines()
    entries = [json.loads(line) for line in lines]  # fails on the first line that is not JSON
    loggers = {entry["logger"] for entry in entries}
    assert "compass.controllers.manager" in loggers, lines
    assert any(name.startswith("kopf.") for name in loggers), lines
    assert {entry["level"] for entry in entries} <= {"info", "warning", "error"}, lines
    [watching] = [e for e in entries if e["message"].startswith("compass operator: watching")]
    assert k8s_namespace in watching["message"]
