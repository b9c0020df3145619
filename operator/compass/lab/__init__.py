"""The lab: the local demo, local Triton, experiments, plots, scenarios (never the operator)."""
