"""The router's parts beside its model.py, one job each."""
