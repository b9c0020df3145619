"""Pure logic: no I/O, no kopf, no Kubernetes, no network."""
