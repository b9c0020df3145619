"""The data plane's clients: the Triton router, switching, metrics, profiling and load."""
