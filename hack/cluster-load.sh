#!/usr/bin/env bash
# Imports images from the machine's Docker Engine into the local cluster's
# containerd (make cluster-load), as `kind load docker-image` does for kind:
# the cluster never pulls, so the operator's images (make docker-build) get
# onto the node this way. Usage: hack/cluster-load.sh IMAGE...
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/cluster-lib.sh"

if ! cpid containerd >/dev/null; then
  clog "the cluster's containerd does not run; make cluster-up first"
  exit 1
fi
for image in "$@"; do
  if ! docker image inspect "${image}" >/dev/null 2>&1; then
    clog "Docker has no image ${image}; make docker-build first"
    exit 1
  fi
  clog "importing ${image} ($(docker image inspect -f '{{.Id}}' "${image}"))"
  docker save "${image}" | cctr images import - >/dev/null
done
