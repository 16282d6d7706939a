#!/usr/bin/env bash
# make kind-smoke: checks that the kind cluster KIND_CLUSTER works as a
# three-node cluster, and exits non-zero with the reason if it does not:
#   - three nodes, all Ready, two of them workers;
#   - a pod runs on each worker (pinned by kubernetes.io/hostname);
#   - each pod reaches the other one across nodes by pod IP (HTTP);
#   - a Service is reachable by its DNS name (CoreDNS + kube-proxy), from
#     the other worker;
#   - kubernetes.default resolves.
# The pods run BUSYBOX_IMAGE (make test-images), loaded with
# hack/kind/load.sh; everything is in a namespace of its own, deleted at
# the end.
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=hack/kind/lib.sh
source hack/kind/lib.sh

BUSYBOX_IMAGE=${BUSYBOX_IMAGE:-code-sandbox-test/busybox:1}
TIMEOUT=${KIND_SMOKE_TIMEOUT:-120}
NS=kind-smoke-$(od -An -N4 -tx1 /dev/urandom | tr -d ' \n')
fail() {
  log "SMOKE FAIL: $*"
  kubectl_kind -n "${NS}" get pods,svc,endpointslices -o wide >&2 2>/dev/null || true
  exit 1
}
pass() { log "ok: $*"; }
cleanup() { kubectl_kind delete namespace "${NS}" --wait=false >/dev/null 2>&1 || true; }
trap cleanup EXIT

cluster_exists || fail "no kind cluster ${KIND_CLUSTER} (make kind-up)"
start=${SECONDS}

# Nodes.
mapfile -t workers < <(kubectl_kind get nodes -l '!node-role.kubernetes.io/control-plane' -o jsonpath='{range .items[*]}{.metadata.name}{"\n"}{end}')
nodes=$(kubectl_kind get nodes --no-headers | wc -l)
[[ ${nodes} -eq 3 && ${#workers[@]} -eq 2 ]] || fail "want 3 nodes with 2 workers, have ${nodes} nodes, workers: ${workers[*]:-none}"
notready=$(kubectl_kind get nodes -o jsonpath='{range .items[*]}{.metadata.name} {.status.conditions[?(@.type=="Ready")].status}{"\n"}{end}' | awk '$2 != "True" {print $1}')
[[ -z ${notready} ]] || fail "nodes not Ready: ${notready}"
pass "3 nodes Ready, workers ${workers[*]}"

# One web pod per worker, each serving its node's name.
img=$(hack/kind/load.sh "${BUSYBOX_IMAGE}" | tail -n1)
kubectl_kind create namespace "${NS}" >/dev/null
for i in 0 1; do
  kubectl_kind -n "${NS}" apply -f - >/dev/null <<YAML
apiVersion: v1
kind: Pod
metadata:
  name: web-${i}
  labels: {app: web-${i}}
spec:
  nodeSelector: {kubernetes.io/hostname: ${workers[$i]}}
  terminationGracePeriodSeconds: 1
  containers:
  - name: web
    image: ${img}
    imagePullPolicy: Never
    command: [sh, -c, 'mkdir -p /tmp/www && echo "\$NODE" > /tmp/www/index.html && exec httpd -f -p 8080 -h /tmp/www']
    env:
    - name: NODE
      valueFrom: {fieldRef: {fieldPath: spec.nodeName}}
---
apiVersion: v1
kind: Service
metadata:
  name: web-${i}
spec:
  selector: {app: web-${i}}
  ports: [{port: 80, targetPort: 8080}]
YAML
done
kubectl_kind -n "${NS}" wait --for=condition=Ready pod/web-0 pod/web-1 --timeout="${TIMEOUT}s" >&2 || fail "the web pods are not Ready within ${TIMEOUT}s"
for i in 0 1; do
  on=$(kubectl_kind -n "${NS}" get pod "web-${i}" -o jsonpath='{.spec.nodeName}')
  [[ ${on} == "${workers[$i]}" ]] || fail "pod web-${i} runs on ${on}, not ${workers[$i]}"
done
pass "a pod runs on each worker ($((SECONDS - start))s)"

# fetch FROM URL WANT: HTTP GET from pod FROM, retried for a short while
# (a new Service's rules and endpoints take a moment everywhere).
fetch() {
  local from=$1 url=$2 want=$3 got="" i
  for i in $(seq 15); do
    # timeout, not wget -T: busybox 1.35's static wget crashes with -T.
    got=$(kubectl_kind -n "${NS}" exec "${from}" -- timeout 5 wget -q -O - "${url}" 2>&1) && [[ ${got} == "${want}" ]] && return 0
    sleep 2
  done
  fail "from ${from}: GET ${url} gave '${got}', want '${want}'"
}
ip0=$(kubectl_kind -n "${NS}" get pod web-0 -o jsonpath='{.status.podIP}')
ip1=$(kubectl_kind -n "${NS}" get pod web-1 -o jsonpath='{.status.podIP}')
fetch web-0 "http://${ip1}:8080/" "${workers[1]}"
fetch web-1 "http://${ip0}:8080/" "${workers[0]}"
pass "pod to pod across nodes (${ip0} <-> ${ip1})"

fetch web-0 "http://web-1.${NS}.svc.cluster.local/" "${workers[1]}"
fetch web-1 "http://web-0/" "${workers[0]}"
out=$(kubectl_kind -n "${NS}" exec web-0 -- nslookup kubernetes.default.svc.cluster.local 2>&1) ||
  fail "nslookup kubernetes.default.svc.cluster.local: ${out}"
grep -q "$(kubectl_kind get svc kubernetes -n default -o jsonpath='{.spec.clusterIP}')" <<<"${out}" ||
  fail "kubernetes.default does not resolve to the kubernetes Service's IP: ${out}"
pass "Service DNS (web-1.${NS}.svc.cluster.local, short name, kubernetes.default)"
log "SMOKE PASS in $((SECONDS - start))s"
