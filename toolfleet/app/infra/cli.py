"""``toolfleet infra up | down | status``.

``up`` writes only ``export NAME=value`` lines on stdout (progress goes to stderr), so
``eval "$(toolfleet infra up)"`` exports the addresses into the shell that runs it.
"""

from __future__ import annotations

import shlex
import time

import click

from kernel.errors import ToolfleetError
from kernel.settings import Settings
from toolfleet.app import infra as local
from toolfleet.app.infra.process import ServiceStatus

# `status` exits with this when a service is stopped, like LSB init scripts, so that
# `toolfleet infra status || toolfleet infra up` works.
EXIT_STOPPED = 3


@click.group()
def infra() -> None:
    """Local Apache Kafka (KRaft) and redis-server, kept under TOOLFLEET_STATE_DIR."""


@infra.command()
def up() -> None:
    """Start Kafka and Redis unless already running; print `export` lines for `eval`."""
    began = time.monotonic()
    try:
        current = local.up(Settings())
    except ToolfleetError as exc:
        raise click.ClickException(str(exc)) from exc
    elapsed = time.monotonic() - began
    for service in (current.redis, *filter(None, [current.cluster]), current.kafka):
        if service.state == "external":
            verb = "external, not started"
        elif service.started:
            verb = f"started (pid {service.pid})"
        else:
            verb = f"already running (pid {service.pid})"
        click.echo(f"{service.name}: {verb} at {service.address}", err=True)
    click.echo(f"ready in {elapsed:.1f} s", err=True)
    for name, value in current.env().items():
        click.echo(f"export {name}={shlex.quote(value)}")


@infra.command()
def down() -> None:
    """Stop the Kafka and Redis processes that `up` started; their data is kept."""
    settings = Settings()
    try:
        before = local.down(settings)
    except ToolfleetError as exc:
        raise click.ClickException(str(exc)) from exc
    for service in (before.kafka, before.redis, *filter(None, [before.cluster])):
        if service.state == "running":
            click.echo(f"{service.name}: stopped (pid {service.pid})")
        else:
            click.echo(f"{service.name}: {service.state}, nothing to stop")


@infra.command()
def status() -> None:
    """Show running / stopped / external for Kafka and Redis; exit 3 if one is stopped."""
    current = local.status(Settings())
    for service in (current.kafka, current.redis, *filter(None, [current.cluster])):
        click.echo(_describe(service))
    if not current.available:
        click.get_current_context().exit(EXIT_STOPPED)


def _describe(service: ServiceStatus) -> str:
    pid = f"pid {service.pid}" if service.pid else "-"
    return f"{service.name:<6} {service.state:<8} {pid:<11} {service.address}"
