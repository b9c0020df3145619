"""Evaluators (replay, command, Triton, and the factory that picks one) and the search checkpoint."""
