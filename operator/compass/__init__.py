"""compass-operator: keep a compound-AI workflow inside its accuracy and latency SLOs."""

__version__ = "0.1.0"
