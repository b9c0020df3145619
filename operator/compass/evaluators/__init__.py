"""Evaluators (replay, command, Triton, the factory that picks one) and the search checkpoint."""
