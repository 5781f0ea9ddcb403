# trex operator: the kopf controller (`trex operator run`). The project is installed without its
# dependencies and the operator's own are pinned here: the API models, kopf and the Kubernetes client,
# and the CPU build of torch, which the TrainJob memory plan needs to build the model on the meta device.
# Build from the repository root: docker build -f images/operator.Dockerfile -t ghcr.io/trex-dev/trex-operator:0.1.0 .

FROM python:3.12.11-slim-bookworm AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
RUN pip install --index-url https://download.pytorch.org/whl/cpu torch==2.13.0 \
 && pip install \
      kopf==1.45.2 kubernetes==37.0.2 kubernetes-validate==1.37.0 pydantic==2.14.4 \
      prometheus-client==0.26.0 PyYAML==6.0.4 rich==15.0.0 aiohttp==3.14.5 psutil==7.2.2
COPY pyproject.toml README.md /src/
COPY workloads /src/workloads
COPY operator /src/operator
RUN pip install --no-deps /src

FROM python:3.12.11-slim-bookworm
LABEL org.opencontainers.image.title="trex-operator" \
      org.opencontainers.image.source="https://github.com/trex-dev/trex" \
      org.opencontainers.image.licenses="Apache-2.0"
RUN groupadd --gid 65532 trex && useradd --uid 65532 --gid 65532 --no-create-home --shell /usr/sbin/nologin trex
COPY --from=build /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 HOME=/tmp
USER 65532:65532
EXPOSE 8080 9090
ENTRYPOINT ["trex", "operator", "run"]
