#!/usr/bin/env bash
# Makes the in-cluster snapshot registry's TLS material
# (config/components/snapshot-registry): a CA of its own, used once and
# thrown away (no CA key is kept anywhere), and a serving certificate for
# the registry's Service (its fixed ClusterIP and its DNS names), in the
# Secret code-sandbox-snapshot-registry-tls; the CA certificate, which the
# node managers alone trust for the registry (--snapshot-registry-ca), in
# the ConfigMap code-sandbox-snapshot-registry-ca. Leaves both alone when
# the Secret holds a certificate for that address valid for 30 more days,
# and the ConfigMap exists; otherwise makes new ones (restart the registry
# and the managers after that: both read them at start).
#
# Called by `make deploy` when DEPLOY_CONFIG uses the component.
#   hack/ensure-snapshot-registry-tls.sh [namespace] [cluster IP]
set -euo pipefail
namespace=${1:-code-sandbox-system}
ip=${2:-10.96.0.50}
secret=code-sandbox-snapshot-registry-tls
configmap=code-sandbox-snapshot-registry-ca
service=code-sandbox-snapshot-registry

kubectl get namespace "$namespace" >/dev/null 2>&1 || kubectl create namespace "$namespace" >/dev/null
if crt=$(kubectl get secret -n "$namespace" "$secret" -o 'jsonpath={.data.tls\.crt}' 2>/dev/null) && [[ -n $crt ]] &&
  kubectl get configmap -n "$namespace" "$configmap" >/dev/null 2>&1; then
  pem=$(base64 -d <<<"$crt")
  if openssl x509 -noout -checkend $((30 * 24 * 3600)) <<<"$pem" >/dev/null &&
    openssl x509 -noout -checkip "$ip" <<<"$pem" | grep -q 'does match'; then
    echo "ensure-snapshot-registry-tls: Secret $namespace/$secret is current"
    exit 0
  fi
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout ca.key -out ca.crt -days 825 \
  -subj "/CN=code-sandbox snapshot registry CA" \
  -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign 2>/dev/null
openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout tls.key -out tls.csr \
  -subj "/CN=$service.$namespace.svc" 2>/dev/null
cat >ext.cnf <<EXT
basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature
extendedKeyUsage=serverAuth
subjectAltName=IP:$ip,DNS:$service.$namespace.svc,DNS:$service.$namespace.svc.cluster.local,DNS:$service.$namespace
EXT
openssl x509 -req -in tls.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 398 -extfile ext.cnf -out tls.crt 2>/dev/null
rm -f ca.key
kubectl create secret tls -n "$namespace" "$secret" --cert=tls.crt --key=tls.key --dry-run=client -o yaml |
  kubectl apply --server-side --force-conflicts --field-manager=code-sandbox-deploy -f - >/dev/null
kubectl create configmap -n "$namespace" "$configmap" --from-file=ca.crt=ca.crt --dry-run=client -o yaml |
  kubectl apply --server-side --force-conflicts --field-manager=code-sandbox-deploy -f - >/dev/null
echo "ensure-snapshot-registry-tls: new CA and certificate for $ip in $namespace/$secret and $namespace/$configmap"
