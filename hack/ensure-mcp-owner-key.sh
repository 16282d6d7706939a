#!/usr/bin/env bash
# Creates the MCP server's owner key Secret (code-sandbox-mcp-owner-key) in
# the operator namespace when it does not exist yet, so that `make deploy`
# gives the MCP server a key that survives its restarts. An existing key is
# never replaced: rotating it makes the server forget its Sandboxes
# (docs/deploy.md, "Owner key"). The key is made here, on the deploying
# machine, and never written to the repository.
set -euo pipefail
namespace=${1:-code-sandbox-system}
secret=code-sandbox-mcp-owner-key

if kubectl get secret -n "$namespace" "$secret" >/dev/null 2>&1; then
  exit 0
fi
kubectl get namespace "$namespace" >/dev/null 2>&1 || kubectl create namespace "$namespace" >/dev/null
key=$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')
kubectl create secret generic -n "$namespace" "$secret" --from-literal=key="$key" >/dev/null
echo "ensure-mcp-owner-key: created Secret $namespace/$secret"
