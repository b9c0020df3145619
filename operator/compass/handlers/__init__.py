"""kopf handlers: thin adapters from Kubernetes events to the pure domain and back.

Importing this package registers every handler with kopf (`kopf run -m compass.handlers`, or
`compass operator`).
"""

from compass.handlers import policy, workflow

__all__ = ["policy", "workflow"]
