"""Development tools, not shipped: `compass demo` (its local Triton, the live runs, the cluster
demo), the local control plane and node."""

# The compass package first: it sets what every process here needs before gRPC loads (its fork
# support off), as for every compass module.
import compass  # noqa: F401
