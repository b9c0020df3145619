"""The operator: pure reconcile decisions, thin kopf handlers, one Kubernetes I/O module."""
