"""compass-operator: keep a compound-AI workflow inside its accuracy and latency SLOs."""

import os

# gRPC's fork support restarts its poller in a forked child, which then aborts on the epoll fd
# that subprocess closed (grpc/grpc#43055, grpcio >= 1.80): a child started with preexec_fn
# while a Triton channel is busy died with SIGABRT before exec. Nothing here needs gRPC across a
# fork (children exec at once), so turn it off unless the user chose; it must be set before
# grpc is imported, and every compass module imports this package first.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

__version__ = "0.1.0"
