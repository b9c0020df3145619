"""The serving rules the operator and the router share: configuration keys, routing keys and
mixes, admission at dispatch, late binding. One implementation, imported by compass.domain and by
the router's model.py (model-images/router), which ships beside it in every Triton model
repository.

The standard library and numpy only (an import-linter contract keeps it so), and Python 3.10
(Triton 24.10's Python backend): no ``StrEnum``, no ``X | Y`` outside annotations.
"""
