# The manager image: one static binary, no shell, no package manager.
# `make docker-build` compiles bin/manager first (CGO_ENABLED=0), so this
# builds offline without pulling a base image.
FROM scratch
COPY bin/manager /manager
ENTRYPOINT ["/manager"]
