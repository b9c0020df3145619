"""The k8s tier's control plane: compass.lab.devcluster, under the name the tests import.

The code moved into the package so that `compass demo --cluster` runs the same control plane
(the package may not import from tests/); `python tests/k8s/cluster.py` still starts one by hand.
"""

from __future__ import annotations

import sys

from compass.lab.devcluster import (
    ADMIN_USER,
    BUILD_SCRIPT,
    CANNOT_BUILD,
    DEFAULT_CONTROLLERS,
    REPO_ROOT,
    SERVICE_CLUSTER_IP_RANGE,
    Binaries,
    Cluster,
    ClusterError,
    ClusterUnavailableError,
    ensure_binaries,
    main,
)
from compass.lab.processes import free_port, log_tail, wait_for

__all__ = [
    "ADMIN_USER",
    "BUILD_SCRIPT",
    "CANNOT_BUILD",
    "DEFAULT_CONTROLLERS",
    "REPO_ROOT",
    "SERVICE_CLUSTER_IP_RANGE",
    "Binaries",
    "Cluster",
    "ClusterError",
    "ClusterUnavailableError",
    "ensure_binaries",
    "free_port",
    "log_tail",
    "main",
    "wait_for",
]

if __name__ == "__main__":
    sys.exit(main())
