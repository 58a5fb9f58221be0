# syntax=docker/dockerfile:1
# One image for both long-running components (and every other subcommand):
#   biaxial kubelet-plugin ...   (DaemonSet, see deploy/helm/biaxial)
#   biaxial controller ...       (Deployment)
# Build:  docker build -t biaxial:0.1.0 .
#
# Stage 1 builds the wheel and installs it with its dependencies into a virtual environment;
# stage 2 copies only that environment onto a clean slim base: no compiler, no pip cache, no
# source tree.

ARG PYTHON_IMAGE=python:3.11-slim

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY biaxial/ biaxial/
COPY driver/ driver/
COPY kubeapi/ kubeapi/
COPY kubeletplugin/ kubeletplugin/
COPY controller/ controller/
COPY deviceclasses/ deviceclasses/
RUN python -m pip wheel --no-deps --wheel-dir /wheels . \
 && python -m venv /opt/biaxial \
 && /opt/biaxial/bin/pip install /wheels/biaxial-*.whl \
 && /opt/biaxial/bin/biaxial --help >/dev/null

FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="biaxial" \
      org.opencontainers.image.description="Kubernetes DRA driver for NVIDIA GPUs with node x GPU binpack/spread scheduling" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /opt/biaxial /opt/biaxial
ENV PATH=/opt/biaxial/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
# The default user is unprivileged (65532, "nonroot" by convention): the controller only talks
# to the API server and runs as this user with a read-only root file system.
#
# The kubelet plugin runs as root but unprivileged (the chart: runAsUser 0, no privilege
# escalation, every capability dropped) because the host directories it writes belong to root:
#   * its registration and DRA sockets in the kubelet's /var/lib/kubelet/plugins_registry and
#     /var/lib/kubelet/plugins;
#   * CDI specs in the runtime's /var/run/cdi, its checkpoint in /var/lib/biaxial, MPS pipe and
#     log directories under /run/biaxial/mps, HAMi-core's lock directory /tmp/vgpulock.
# The GPUs' device nodes and libnvidia-ml come from the NVIDIA container toolkit, not from
# privileges. docs/operations.md ("What the plugin may do") says the same for operators.
USER 65532:65532
ENTRYPOINT ["biaxial"]
CMD ["--help"]
