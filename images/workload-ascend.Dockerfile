# trex workloads on Ascend NPUs: the CANN image (toolkit + kernels, Python 3.11) with the matching
# torch and torch_npu pinned; the driver and firmware come from the host (mounted by the device plugin).
# Build from the repository root: docker build -f images/workload-ascend.Dockerfile -t ghcr.io/trex-dev/trex-workload-ascend:0.1.0 .

FROM python:3.11.13-slim-bookworm AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
COPY pyproject.toml README.md /src/
COPY workloads /src/workloads
COPY operator /src/operator
RUN pip wheel --no-deps --wheel-dir /wheels /src

FROM quay.io/ascend/cann:8.5.0-910b-ubuntu22.04-py3.11
LABEL org.opencontainers.image.title="trex-workload-ascend" \
      org.opencontainers.image.source="https://github.com/trex-dev/trex" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
RUN pip install --index-url https://download.pytorch.org/whl/cpu torch==2.6.0 \
 && pip install torch-npu==2.6.0 \
 && groupadd --gid 65532 trex && useradd --uid 65532 --gid 65532 --create-home --shell /bin/bash trex
COPY --from=build /wheels /wheels
# the [hf] extra: transformers for the transformers / trex-checkpoint evaluation models
RUN pip install "$(echo /wheels/trex-*.whl)[hf]" && rm -rf /wheels
# The CANN environment (set_env.sh) for every process, including non-login shells of the pod.
ENV ASCEND_TOOLKIT_HOME=/usr/local/Ascend/ascend-toolkit/latest \
    LD_LIBRARY_PATH=/usr/local/Ascend/driver/lib64/driver:/usr/local/Ascend/driver/lib64/common:/usr/local/Ascend/ascend-toolkit/latest/lib64:/usr/local/Ascend/ascend-toolkit/latest/lib64/plugin/opskernel \
    ASCEND_OPP_PATH=/usr/local/Ascend/ascend-toolkit/latest/opp \
    PYTHONUNBUFFERED=1
WORKDIR /home/trex
USER 65532:65532
EXPOSE 9400
ENTRYPOINT ["trex"]
CMD ["--help"]
