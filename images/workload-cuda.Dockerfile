# trex workloads on NVIDIA GPUs: the PyTorch CUDA runtime image brings torch, CUDA, cuDNN, NCCL and
# triton; the project is installed on top (its torch range accepts the image's torch).
# Build from the repository root: docker build -f images/workload-cuda.Dockerfile -t ghcr.io/trex-dev/trex-workload-cuda:0.1.0 .

FROM python:3.11.13-slim-bookworm AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
COPY pyproject.toml README.md /src/
COPY workloads /src/workloads
COPY operator /src/operator
RUN pip wheel --no-deps --wheel-dir /wheels /src

FROM pytorch/pytorch:2.7.1-cuda12.8-cudnn9-runtime
LABEL org.opencontainers.image.title="trex-workload-cuda" \
      org.opencontainers.image.source="https://github.com/trex-dev/trex" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 DEBIAN_FRONTEND=noninteractive
# gcc: triton compiles its launchers at run time; bubblewrap: the sandbox's kernel-fs isolation of generated
# solver programs. Versions follow the pinned base image's Ubuntu release.
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends gcc libc6-dev bubblewrap \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --gid 65532 trex && useradd --uid 65532 --gid 65532 --create-home --shell /usr/sbin/nologin trex
COPY --from=build /wheels /wheels
# torch comes from the base image: pip keeps it because it satisfies the project's range.
# the [hf] extra: transformers for the transformers / trex-checkpoint evaluation models
RUN pip install "$(echo /wheels/trex-*.whl)[hf]" && rm -rf /wheels
ENV PYTHONUNBUFFERED=1
WORKDIR /home/trex
USER 65532:65532
EXPOSE 9400
ENTRYPOINT ["trex"]
CMD ["--help"]
