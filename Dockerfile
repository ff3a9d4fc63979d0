# One image for every Ferry component: `ferry controlplane`, `ferry proxy`, `ferry node`
# (the agent), `ferry batch-runtime`; `ferryctl` is on PATH too. docs/deploy.md builds it:
#   docker build -t ferry:0.1.0 .
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# Build: wheels of the project and of the exact versions its pyproject.toml pins, then a
# virtual environment installed from those wheels alone.
FROM ${PYTHON_IMAGE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
WORKDIR /src
COPY pyproject.toml ./
COPY ferry ferry
COPY ferry_cli ferry_cli
COPY harness harness
COPY controlplane controlplane
COPY dataplane dataplane
COPY agent agent
COPY tools tools
RUN python -m pip wheel --wheel-dir /wheels . \
 && python -m venv /opt/ferry \
 && /opt/ferry/bin/pip install --no-index --find-links /wheels ferry \
 && /opt/ferry/bin/ferry --help >/dev/null

# Run: the same base, the virtual environment, no compiler, no pip cache, no root.
FROM ${PYTHON_IMAGE}
ENV PATH=/opt/ferry/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    GRPC_VERBOSITY=ERROR
RUN groupadd --system --gid 10001 ferry \
 && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
      --shell /usr/sbin/nologin ferry
COPY --from=build /opt/ferry /opt/ferry
USER 10001:10001
WORKDIR /tmp
# Control plane gRPC, proxy gRPC and HTTP, metrics (the manifests' ports; every address is a flag).
EXPOSE 7070 50051 8080 9090
ENTRYPOINT ["ferry"]
CMD ["--help"]
