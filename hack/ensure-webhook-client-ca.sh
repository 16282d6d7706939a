#!/usr/bin/env bash
# Puts the CA that signs kube-apiserver's webhook client certificate (a PEM
# file, the first argument) into the ConfigMap code-sandbox-webhook-client-ca
# of the operator namespace, for config/components/webhook-client-auth.
# Called by `make deploy WEBHOOK_CLIENT_CA=<file>`; replaces an earlier CA
# (the webhook reads it at start: restart it after a rotation).
set -euo pipefail
ca=${1:?usage: ensure-webhook-client-ca.sh <ca.pem> [namespace]}
namespace=${2:-code-sandbox-system}
configmap=code-sandbox-webhook-client-ca

if [[ ! -r $ca ]]; then
  echo "WEBHOOK_CLIENT_CA=$ca: no such readable file" >&2
  exit 1
fi
if ! grep -q -- '-----BEGIN CERTIFICATE-----' "$ca"; then
  echo "WEBHOOK_CLIENT_CA=$ca: no PEM certificate in the file" >&2
  exit 1
fi
kubectl get namespace "$namespace" >/dev/null 2>&1 || kubectl create namespace "$namespace" >/dev/null
kubectl create configmap -n "$namespace" "$configmap" --from-file=ca.crt="$ca" --dry-run=client -o yaml |
  kubectl apply --server-side --field-manager=code-sandbox-deploy -f - >/dev/null
echo "ensure-webhook-client-ca: ConfigMap $namespace/$configmap holds $ca"
