# syntax=docker/dockerfile:1
# One image for both long-running components (and every other subcommand):
#   biaxial kubelet-plugin ...   (DaemonSet, see deploy/helm/biaxial)
#   biaxial controller ...       (Deployment)
# Build:  docker build -t biaxial:0.1.0 .
#         docker build --build-arg HAMI_CORE=none -t biaxial:0.1.0 .   (no HAMi-core: quick,
#         for clusters without GPUs such as kind; the chart then needs
#         kubeletPlugin.hamiCoreLibrary="")
#
# Stage "hami-core-build" builds HAMi-core's libvgpu.so (the hami-core sharing strategy's
# CUDA intercept library, docs/sharing.md) from its upstream source at a pinned commit, the
# way HAMi's own image builds it: the project's build.sh (cmake) in an NVIDIA CUDA devel image,
# which has the CUDA headers and the libcuda / libnvidia-ml stubs it links against. The library
# is preloaded into tenants' containers, whatever their C library, so it is built on an old
# glibc (Ubuntu 20.04), as HAMi does.
# Stage "build" builds the wheel and installs it with its dependencies into a virtual
# environment. The final stage copies only that environment and libvgpu.so onto a clean slim
# base: no compiler, no CUDA toolkit, no pip cache, no source tree.
#
# This Dockerfile has not been built in this repository's CI (there is no container engine
# there); tests/unit/test_chart.py checks its structure and the chart that uses it.

# Base images by tag for a development build; a release pins each by digest, read from the
# registry at release time (docs/operations.md, "Building a release image"), e.g.
#   --build-arg PYTHON_IMAGE=python:3.11-slim@sha256:<digest>
ARG PYTHON_IMAGE=python:3.11-slim
# The CUDA devel image of HAMi v2.9.0's own build stage (docker/Dockerfile, NVIDIA_IMAGE).
ARG CUDA_DEVEL_IMAGE=nvidia/cuda:12.9.1-cudnn-devel-ubuntu20.04
# HAMi-core at the commit HAMi v2.9.0 ships (its libvgpu submodule): "Merge pull request #198
# from Project-HAMi/fix_v2_9_0", 2026-05-18. HAMi-core publishes no release tags of its own.
ARG HAMI_CORE_REPOSITORY=https://github.com/Project-HAMi/HAMi-core.git
ARG HAMI_CORE_COMMIT=5091a2fbe1816df1265490f771346730f29e2c8d
ARG HAMI_CORE_VERSION=v2.9.0
# "build" (default) or "none" (an image without libvgpu.so).
ARG HAMI_CORE=build

FROM ${CUDA_DEVEL_IMAGE} AS hami-core-build
ARG HAMI_CORE_REPOSITORY
ARG HAMI_CORE_COMMIT
ARG HAMI_CORE_VERSION
ENV DEBIAN_FRONTEND=noninteractive
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates cmake git make \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src/hami-core
# A full clone, then the pinned commit: the build fails if upstream ever loses it.
RUN git clone "${HAMI_CORE_REPOSITORY}" . \
 && git checkout --detach "${HAMI_CORE_COMMIT}" \
 && test "$(git rev-parse HEAD)" = "${HAMI_CORE_COMMIT}"
RUN bash ./build.sh \
 && test -s build/libvgpu.so \
 && mkdir -p /out \
 && cp build/libvgpu.so /out/libvgpu.so \
 && printf 'HAMi-core %s (commit %s, %s)\n' "${HAMI_CORE_VERSION}" "${HAMI_CORE_COMMIT}" \
      "${HAMI_CORE_REPOSITORY}" > /out/VERSION

FROM ${PYTHON_IMAGE} AS hami-core-none
RUN mkdir -p /out

FROM hami-core-${HAMI_CORE} AS hami-core

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY requirements/runtime.lock requirements/
COPY biaxial/ biaxial/
COPY driver/ driver/
COPY kubeapi/ kubeapi/
COPY kubeletplugin/ kubeletplugin/
COPY controller/ controller/
COPY deviceclasses/ deviceclasses/
# The dependencies exactly as locked (every file's hash checked), then the project's own
# wheel on top without resolving anything again.
RUN python -m pip wheel --no-deps --wheel-dir /wheels . \
 && python -m venv /opt/biaxial \
 && /opt/biaxial/bin/pip install --require-hashes -r requirements/runtime.lock \
 && /opt/biaxial/bin/pip install --no-deps /wheels/biaxial-*.whl \
 && /opt/biaxial/bin/biaxial --help >/dev/null

FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="biaxial" \
      org.opencontainers.image.description="Kubernetes DRA driver for NVIDIA GPUs with node x GPU binpack/spread scheduling" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /opt/biaxial /opt/biaxial
# HAMi-core's libvgpu.so (and VERSION): the chart's init container copies it to each GPU
# node's host path (kubeletPlugin.hamiCoreLibrary); the plugin itself never loads it.
COPY --from=hami-core /out/ /opt/biaxial/hami-core/
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
