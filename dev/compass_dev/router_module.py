"""The generic router's model.py (model-images/router) as a Python module outside Triton.

Its decisions (admission, late binding) are plain functions; the benches time them and the unit
tests hold them to compass.domain's, without a tritonserver. Triton's ``triton_python_backend_utils``
exists only inside a Python backend stub, so a bare stand-in takes its name while model.py is
imported: nothing that is called here touches it.
"""

from __future__ import annotations

import importlib.util
import sys
import types
from functools import cache

from compass.lab.local_triton import model_images

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
