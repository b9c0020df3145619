"""Kubernetes: the CRD models (single source of truth), their YAML, and pure object builders."""
