"""`compass operator` as a child process against the test cluster: compass_dev.devcluster.Operator.

Moved into the package with the control plane, so that `compass demo --cluster` runs it too.
"""

from __future__ import annotations

from compass_dev.devcluster import OPERATOR_START_S, Operator

__all__ = ["OPERATOR_START_S", "Operator"]
