# trex workloads on CPU: trainer, AuraKernel (cpu-c backend compiles C at run time, hence gcc),
# OR data pipeline and evaluation. torch is the pinned CPU build.
# Build from the repository root: docker build -f images/workload-cpu.Dockerfile -t ghcr.io/trex-dev/trex-workload-cpu:0.1.0 .

FROM python:3.12.11-slim-bookworm AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
RUN pip install --index-url https://download.pytorch.org/whl/cpu torch==2.13.0
COPY pyproject.toml README.md /src/
COPY workloads /src/workloads
COPY operator /src/operator
# the [hf] extra: transformers for the transformers / trex-checkpoint evaluation models
RUN pip install "/src[hf]"

FROM python:3.12.11-slim-bookworm
LABEL org.opencontainers.image.title="trex-workload-cpu" \
      org.opencontainers.image.source="https://github.com/trex-dev/trex" \
      org.opencontainers.image.licenses="Apache-2.0"
# gcc: the cpu-c kernel backend; bubblewrap: the sandbox's kernel-fs isolation of generated solver programs.
# Debian's packages are tracked by the pinned bookworm base image; versions follow its point release.
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends gcc libc6-dev bubblewrap \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --gid 65532 trex && useradd --uid 65532 --gid 65532 --create-home --shell /usr/sbin/nologin trex
COPY --from=build /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1
WORKDIR /home/trex
USER 65532:65532
EXPOSE 9400
ENTRYPOINT ["trex"]
CMD ["--help"]
