#!/usr/bin/env bash
# Start a local Kubernetes control plane (etcd, kube-apiserver, kube-controller-manager) and a
# node helper that runs pods as local processes; print the KUBECONFIG; Ctrl-C stops everything.
# The same code the k8s test tier and `compass demo --cluster` use (compass_dev.devcluster,
# compass_dev.devnode).
#   hack/k8s/start.sh [--workdir DIR] [--no-node]
set -euo pipefail
# shellcheck source=hack/lib/venv.sh
source "$(dirname "${BASH_SOURCE[0]}")/../lib/venv.sh"
ensure_venv dev
exec "${VENV}/bin/python" -m compass_dev.devcluster "$@"
