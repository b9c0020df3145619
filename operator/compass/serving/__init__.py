"""The data plane: Triton routing, queue-depth metrics, latency profiling and load generation."""
