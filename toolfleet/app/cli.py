"""The ``toolfleet`` command: local infrastructure and the services."""

from __future__ import annotations

import importlib
from typing import Any

import click

from executors.worker import WorkerLimits
from kernel.errors import ConfigurationError, MissingExtraError
from kernel.settings import Settings
from toolfleet.app.console import console
from toolfleet.app.infra.cli import infra
from toolfleet.app.ops_cli import approvals, inspect, smoke, tasks, tenants, tools, topics
from toolfleet.app.service import run_service

_EXTRA_OF = {
    "agents": "agents",
    "openai": "agents",
    "starlette": "console",
    "uvicorn": "console",
    "sse_starlette": "console",
    "authlib": "console",
    "joserfc": "console",
    "itsdangerous": "console",
    "testcontainers": "containers",
}
"""The extra that installs each optional package a command may import (pyproject.toml's
[project.optional-dependencies]; the packaging test runs each command without its extra)."""


class _Toolfleet(click.Group):
    """The ``toolfleet`` group: a command whose optional packages are not installed ends with
    one line naming the extra that installs them (``pip install 'toolfleet[console]'``), not a
    traceback about a module."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except MissingExtraError as exc:
            raise click.ClickException(str(exc)) from exc
        except ModuleNotFoundError as exc:
            extra = _EXTRA_OF.get((exc.name or "").partition(".")[0])
            if extra is None:
                raise
            what = f"toolfleet {ctx.invoked_subcommand}"
            missing = MissingExtraError(what, extra=extra, missing=exc.name)
            raise click.ClickException(str(missing)) from exc


@click.group(cls=_Toolfleet)
def main() -> None:
    """toolfleet: run AI agents' tool calls on a fleet of workers, through Kafka."""


main.add_command(infra)
main.add_command(tasks)
main.add_command(inspect)
main.add_command(tools)
main.add_command(tenants)
main.add_command(topics)
main.add_command(smoke)
main.add_command(approvals)
main.add_command(console)


@main.command()
def planner() -> None:
    """Plan model responses: dedupe, approvals, one command per call."""
    from planner.service import Planner

    settings = Settings()
    run_service("planner", settings, lambda bus, redis: Planner(settings, bus=bus, redis=redis))


@main.command()
def aggregator() -> None:
    """Reassemble outcomes in model order into one TurnResult per turn."""
    from aggregator.service import Aggregator

    settings = Settings()
    run_service(
        "aggregator", settings, lambda bus, redis: Aggregator(settings, bus=bus, redis=redis)
    )


@main.command()
def reconciler() -> None:
    """Resolve calls whose effect is unknown: probe, retry, compensate, or ask a human."""
    from reconciler.service import Reconciler

    settings = Settings()
    run_service(
        "reconciler", settings, lambda bus, redis: Reconciler(settings, bus=bus, redis=redis)
    )


@main.command()
@click.option("--tools", "tools_ref", required=True, help="module:attribute of a ToolRegistry")
@click.option("--pool", default="default", show_default=True, help="Worker pool to serve.")
@click.option(
    "--concurrency",
    default=WorkerLimits.per_worker,
    show_default=True,
    help="Calls at once, per process (they count in the pool's capacity for admission).",
)
@click.option(
    "--lease-s",
    default=WorkerLimits.lease_s,
    show_default=True,
    help="Seconds a silent worker keeps a call.",
)
def worker(
    *,
    tools_ref: str,
    pool: str,
    concurrency: int,
    lease_s: float,
) -> None:
    """Serve a ToolRegistry as one worker of a pool."""
    from executors import ToolRegistry
    from executors.worker import Worker

    registry = load_object(tools_ref)
    if not isinstance(registry, ToolRegistry):
        raise click.BadParameter(f"{tools_ref} is a {type(registry).__name__}, not a ToolRegistry")
    limits = WorkerLimits(per_worker=concurrency, lease_s=lease_s)
    settings = Settings()
    run_service(
        f"worker-{pool}",
        settings,
        lambda bus, redis: Worker(settings, registry, pool, limits, bus=bus, redis=redis),
        pools=(pool,),
    )


@main.command()
def demo() -> None:
    """Run a fleet on this machine and push one model response through it."""
    import asyncio

    from toolfleet.app.demo import run_demo

    asyncio.run(run_demo(Settings()))


def load_object(reference: str) -> object:
    """Import ``module:attribute``."""
    module_name, _, attribute = reference.partition(":")
    if not attribute:
        raise ConfigurationError(f"expected module:attribute, got {reference!r}")
    return getattr(importlib.import_module(module_name), attribute)
