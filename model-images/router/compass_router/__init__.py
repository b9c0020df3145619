"""The router's parts beside its model.py, one job each: state files (state), the instances'
shared table and gate (gate), late binding as a request runs (binding), the pending-count
poller (poller) and the metrics it exports (metrics)."""
