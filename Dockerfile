# syntax=docker/dockerfile:1
# fairgate: a small non-root image for `fairgate serve` and `fairgate dispatch`.
#
#   docker build -t fairgate:0.1.0 .
#
# Stage 1 builds wheels for fairgate and every dependency. Stage 2 installs
# them from that local wheel directory only (no index, no compiler, no source
# tree), removes pip, and runs as the unprivileged uid/gid 65532.

ARG PYTHON_IMAGE=python:3.11-slim

FROM ${PYTHON_IMAGE} AS builder
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1
WORKDIR /src
COPY . .
RUN python -m pip wheel --wheel-dir /wheels .

FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="fairgate" \
      org.opencontainers.image.description="Admission webhook and weighted-fair dispatcher for shared Kubernetes GPU and MIG clusters" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1
# The wheels are bind-mounted for this one step, so they never become a layer.
RUN --mount=type=bind,from=builder,source=/wheels,target=/wheels \
    python -m pip install --no-index --find-links /wheels fairgate \
 && python -m pip uninstall --yes pip setuptools wheel \
 && fairgate --help >/dev/null
USER 65532:65532
WORKDIR /tmp
EXPOSE 8443
ENTRYPOINT ["fairgate"]
CMD ["--help"]
