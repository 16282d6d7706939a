# The manager image: one static binary and iptables, no shell, no package
# manager. It runs as the manager DaemonSet (as root, for the Docker socket
# and the egress firewall; see config/manager/manager.yaml) and as the
# admission webhook Deployment (--role=control-plane, as 65532). `make
# docker-build` compiles bin/manager first (CGO_ENABLED=0) and stages
# Debian's iptables (nft and legacy, with their libraries, the loader and
# the xtables modules; hack/image-iptables.sh) in bin/image/manager-root,
# so this builds offline without pulling a base image, for the build
# host's architecture.
FROM scratch
# The release version, the same as the binary's (make docker-build VERSION=…).
ARG VERSION=dev
LABEL org.opencontainers.image.version=$VERSION \
      org.opencontainers.image.source=https://github.com/code-sandbox/code-sandbox-operator
# The binary's self-update and update check refuse to run in the image: a
# new image, rolled out by the deployment, updates it (docs/mcp.md#updates).
ENV CODE_SANDBOX_IMAGE=1
COPY bin/image/manager-root/ /
COPY bin/manager /manager
# Non-root unless a Pod says otherwise; the DaemonSet does, explicitly.
USER 65532:65532
ENTRYPOINT ["/manager"]
