"""kopf handlers: thin adapters from Kubernetes events to the pure decisions and back.

Importing this module registers every handler with kopf (`kopf run -m compass.controllers.handlers`,
or `compass operator`).
"""

from compass.controllers import policy_handlers, workflow_handlers

__all__ = ["policy_handlers", "workflow_handlers"]
