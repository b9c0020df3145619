"""The `compass` command line: one module per subcommand, put together by main.py."""

import os

_BLAS_THREAD_VARIABLES = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


def _load_numerics_single_threaded() -> None:
    """Load numpy's and scipy's BLAS with one thread unless the user set a count."""
    saved = {name: os.environ.get(name) for name in _BLAS_THREAD_VARIABLES}
    for name in _BLAS_THREAD_VARIABLES:
        os.environ.setdefault(name, "1")
    try:
        import numpy
        import scipy.stats  # loads scipy's own BLAS, separate from numpy's

        del numpy, scipy
    finally:
        # A --command evaluator inherits the environment and should keep every thread.
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)


# The search's matrices are about 100 x 100: BLAS threads only contend for the cores (the demo
# ran 5x slower on a busy 2-core machine). BLAS reads these variables once, when it is loaded, so
# this must run before anything imports numpy: Python imports this package before any of its
# subcommand modules (and before main.py), which is why it lives here and not in main.py.
_load_numerics_single_threaded()
