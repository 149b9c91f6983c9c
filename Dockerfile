# syntax=docker/dockerfile:1.7
# toolfleet's image: every service (`toolfleet planner|aggregator|reconciler|worker ...`)
# the console (`toolfleet console`) and the MCP front door (`toolfleet mcp`).
# Build:  docker build -t toolfleet:0.1.0 .
# A worker pool that runs your tools needs them in its image: see examples/worker-image.
# EXTRAS: the optional parts it carries (docs/install.md): the console, the MCP door, OTLP
# export and the Agents SDK for SDK tools on workers; --build-arg EXTRAS=console,mcp,otlp
# leaves the SDK out.
ARG PYTHON_VERSION=3.11.7
ARG EXTRAS=agents,console,mcp,otlp

FROM python:${PYTHON_VERSION}-slim-bookworm AS build
ARG EXTRAS
WORKDIR /src
COPY pyproject.toml README.md ./
COPY docker/steps.sh docker/steps.sh
COPY schemas schemas
COPY kernel kernel
COPY planner planner
COPY executors executors
COPY aggregator aggregator
COPY reconciler reconciler
COPY toolfleet toolfleet
RUN TOOLFLEET_EXTRAS="$EXTRAS" docker/steps.sh wheels /wheels

FROM python:${PYTHON_VERSION}-slim-bookworm AS runtime
ARG EXTRAS
ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    TOOLFLEET_METRICS_PORT=9400 \
    HOME=/tmp \
    XDG_STATE_HOME=/tmp/state \
    XDG_CACHE_HOME=/tmp/cache
COPY --from=build /wheels /wheels
COPY docker/steps.sh /usr/local/bin/toolfleet-steps
RUN export TOOLFLEET_EXTRAS="$EXTRAS" \
    && toolfleet-steps install /wheels && rm -rf /wheels && toolfleet-steps check \
    && groupadd --system --gid 10001 toolfleet \
    && useradd --system --uid 10001 --gid 10001 --no-create-home toolfleet
USER 10001:10001
EXPOSE 9400
ENTRYPOINT ["toolfleet"]
CMD ["--help"]
