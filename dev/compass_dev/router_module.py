"""The generic router's model.py (model-images/router) and the modules beside it as Python
modules outside Triton.

Its serving parts (the shared table, the gate, late binding as a request is served) are plain
classes; the benches time them and the unit tests drive them without a tritonserver (the rules
they apply are compass_rules'). Triton's ``triton_python_backend_utils`` exists only inside a
Python backend stub, so a bare stand-in takes its name while model.py is imported: nothing that
is called here touches it.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types
from functools import cache

from compass_dev.local_triton import model_images

BACKEND_UTILS = "triton_python_backend_utils"


@cache
def router_module() -> types.ModuleType:
    """model-images/router/model.py, imported once."""
    path = model_images() / "router" / "model.py"
    placeholder = BACKEND_UTILS not in sys.modules
    if placeholder:
        sys.modules[BACKEND_UTILS] = types.ModuleType(BACKEND_UTILS)
    try:
        spec = importlib.util.spec_from_file_location("compass_router_model", path)
        if spec is None or spec.loader is None:
            raise ImportError(f"cannot load {path}")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        if placeholder:
            del sys.modules[BACKEND_UTILS]
    return module


def router_part(name: str) -> types.ModuleType:
    """One of the router's parts beside model.py (``gate``, ``binding``, ``state``, ...: the
    compass_router package), as model.py imported it."""
    router_module()
    return importlib.import_module(f"compass_router.{name}")


def pipeline_module(workflow: str) -> types.ModuleType:
    """A workflow's pipeline.py (model-images/WORKFLOW/models/router/1) as the router runs it,
    loaded afresh (its data beside it; no Triton)."""
    path = model_images() / workflow / "models" / "router" / "1" / "pipeline.py"
    spec = importlib.util.spec_from_file_location(f"{workflow.replace('-', '_')}_pipeline", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
