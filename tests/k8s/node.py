"""The k8s tier's node helper: compass.lab.devnode, under the name the tests import.

The code moved into the package so that `compass demo --cluster` runs the same node.
"""

from __future__ import annotations

from compass.lab.devnode import (
    HOST_IP,
    MESSAGE_BYTES,
    MESSAGE_LINES,
    POD_NETWORK,
    RESTART_DELAY_S,
    CommandHook,
    Container,
    ContainerConfigError,
    LocalImage,
    Node,
    Pod,
    expand,
    image_keys,
)
from compass.lab.processes import venv_executable

__all__ = [
    "HOST_IP",
    "MESSAGE_BYTES",
    "MESSAGE_LINES",
    "POD_NETWORK",
    "RESTART_DELAY_S",
    "CommandHook",
    "Container",
    "ContainerConfigError",
    "LocalImage",
    "Node",
    "Pod",
    "expand",
    "image_keys",
    "venv_executable",
]
