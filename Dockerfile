# The manager image: one static binary, no shell, no package manager. It runs
# as the manager DaemonSet (as root, for the Docker socket; see
# config/manager/manager.yaml) and as the admission webhook Deployment
# (--role=webhook, as 65532). `make docker-build` compiles bin/manager first
# (CGO_ENABLED=0), so this builds offline without pulling a base image.
FROM scratch
COPY bin/manager /manager
# Non-root unless a Pod says otherwise; the DaemonSet does, explicitly.
USER 65532:65532
ENTRYPOINT ["/manager"]
