# trex workloads on Ascend NPUs: Ascend's CANN image (toolkit, ops, NNAL; Python 3.11) with the torch and
# torch_npu builds that torch_npu's compatibility matrix pairs with that CANN release. The driver, firmware and
# device nodes come from the host: the Ascend Docker Runtime mounts them into each container the Ascend device
# plugin gives NPUs to (see docs/cluster.md, "Ascend nodes").
# Build from the repository root: docker build -f images/workload-ascend.Dockerfile -t ghcr.io/trex-dev/trex-workload-ascend:0.1.0 .

FROM python:3.11.13-slim-bookworm AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
COPY pyproject.toml README.md /src/
COPY workloads /src/workloads
COPY operator /src/operator
RUN pip wheel --no-deps --wheel-dir /wheels /src

# CANN 9.2.0 <-> torch 2.13.0 + torch_npu 2.13.0 (TorchNPU 26.2.0 release notes' table, branch v2.13.0-26.2.0):
# the torch CI runs, whose FSDP2 internals the masters and swap code read.
FROM quay.io/ascend/cann:9.2.0-910b-ubuntu22.04-py3.11
ARG TORCH_VERSION=2.13.0
ARG TORCH_NPU_VERSION=2.13.0
# Group of the driver's device nodes (/dev/davinci*, root:HwHiAiUser 0660) on the hosts: match the host's gid.
ARG HWHIAIUSER_GID=1000
LABEL org.opencontainers.image.title="trex-workload-ascend" \
      org.opencontainers.image.source="https://github.com/trex-dev/trex" \
      org.opencontainers.image.licenses="Apache-2.0" \
      dev.trex.cann.version="9.2.0" \
      dev.trex.torch.version="${TORCH_VERSION}" \
      dev.trex.torch-npu.version="${TORCH_NPU_VERSION}"
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# bubblewrap: the sandbox's kernel-fs isolation of generated solver programs (version of the base's Ubuntu release).
# hadolint ignore=DL3008
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends bubblewrap \
 && rm -rf /var/lib/apt/lists/*
RUN pip install --index-url https://download.pytorch.org/whl/cpu "torch==${TORCH_VERSION}" \
 && pip install "torch-npu==${TORCH_NPU_VERSION}" \
 && if getent group HwHiAiUser >/dev/null; then groupmod --gid "${HWHIAIUSER_GID}" HwHiAiUser; \
    else groupadd --gid "${HWHIAIUSER_GID}" HwHiAiUser; fi \
 && groupadd --gid 65532 trex \
 && useradd --uid 65532 --gid 65532 --groups HwHiAiUser --create-home --shell /bin/bash trex
COPY --from=build /wheels /wheels
# the [hf] extra: transformers for the transformers / trex-checkpoint evaluation models
RUN pip install "$(echo /wheels/trex-*.whl)[hf]" && rm -rf /wheels
COPY images/workload-ascend-entrypoint.sh /usr/local/bin/trex-ascend-entrypoint
# The base image's ENV already carries set_env.sh's variables (PATH, LD_LIBRARY_PATH, ASCEND_*); nothing here
# replaces them. The entrypoint sources the scripts too, for what they compute at run time.
ENV PYTHONUNBUFFERED=1
WORKDIR /home/trex
USER 65532:65532
EXPOSE 9400
ENTRYPOINT ["/usr/local/bin/trex-ascend-entrypoint"]
CMD ["trex", "--help"]
