"""Importing this registers every kopf handler (`kopf run -m compass.controllers.handlers`)."""

from compass.controllers import policy_handlers, workflow_handlers

__all__ = ["policy_handlers", "workflow_handlers"]
