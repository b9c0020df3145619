"""The lab: demos, a local control plane and node, local Triton, experiments, plots, scenarios."""
