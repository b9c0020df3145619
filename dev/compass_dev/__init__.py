"""Development tools, not shipped: the local control plane and node, and `compass demo --cluster`."""

# The compass package first: it sets what every process here needs before gRPC loads (its fork
# support off), as for every compass module.
import compass  # noqa: F401
