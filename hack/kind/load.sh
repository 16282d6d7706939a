#!/usr/bin/env bash
# make kind-load: loads Docker images into every node of KIND_CLUSTER and
# prints, one per line, the reference each was loaded under.
#
# An image tagged :latest (or not tagged) is loaded under a fixed tag made
# from its image ID, repo:kind-<12 hex>: with :latest the kubelet would
# pull on every start (imagePullPolicy Always), which fails with no
# registry; and a rebuilt image gets a new tag, so a deploy with it rolls
# the pods. Other tags are loaded as they are.
#
#   hack/kind/load.sh IMAGE...
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=hack/kind/lib.sh
source hack/kind/lib.sh

(($# > 0)) || die "usage: $0 IMAGE..."
cluster_exists || die "no kind cluster ${KIND_CLUSTER} (make kind-up)"
node=$(docker ps -q --filter "label=io.x-k8s.kind.cluster=${KIND_CLUSTER}" | head -n1)
[[ -n ${node} ]] || die "cluster ${KIND_CLUSTER} has no running node"
use_shim_if_needed "$(docker inspect -f '{{.Config.Image}}' "${node}")"

refs=()
for img in "$@"; do
  id=$(docker image inspect -f '{{.Id}}' "${img}" 2>/dev/null) || die "image ${img} is not in Docker (make docker-build?)"
  name=${img%@*}
  last=${name##*/}
  if [[ ${last} == *:* ]]; then
    repo=${name%:*}
    tag=${name##*:}
  else
    repo=${name}
    tag=""
  fi
  if [[ -z ${tag} || ${tag} == latest ]]; then
    id=${id#sha256:}
    ref=${repo}:kind-${id:0:12}
    docker tag "${img}" "${ref}"
  else
    ref=${repo}:${tag}
  fi
  refs+=("${ref}")
done
"${KIND}" load docker-image --name "${KIND_CLUSTER}" "${refs[@]}" >&2
printf '%s\n' "${refs[@]}"
