"""The ``toolfleet`` command: local infrastructure and the services."""

from __future__ import annotations

import importlib
import re
from typing import Any

import click
from pydantic import AliasChoices, ValidationError

from executors.worker import WorkerLimits
from kernel.errors import ConfigurationError, MissingExtraError
from kernel.settings import Settings
from toolfleet.app.console import console
from toolfleet.app.infra.cli import infra
from toolfleet.app.mcp import mcp
from toolfleet.app.migrate import migrate
from toolfleet.app.ops_cli import (
    approvals,
    calls,
    inspect,
    smoke,
    tasks,
    tenants,
    tools,
    topics,
)
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
    "mcp": "mcp",
    "mcp_types": "mcp",
    "jwt": "mcp",
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
main.add_command(calls)
main.add_command(tools)
main.add_command(tenants)
main.add_command(topics)
main.add_command(smoke)
main.add_command(approvals)
main.add_command(console)
main.add_command(mcp)
main.add_command(migrate)


def service_settings() -> Settings:
    """The settings from the environment; one that does not validate is a usage error that
    names its variable (not a pydantic traceback)."""
    try:
        return Settings()
    except ValidationError as exc:
        problems = "; ".join(_setting_problem(error) for error in exc.errors(include_url=False))
        raise click.ClickException(f"invalid setting: {problems}") from None


_SECRET_WORDS = ("password", "secret", "key", "token")


def _setting_problem(error: Any) -> str:
    name = str(error["loc"][0]) if error.get("loc") else "?"
    field = Settings.model_fields.get(name)
    alias = field.validation_alias if field is not None else None
    variable = (
        str(alias.choices[0])
        if isinstance(alias, AliasChoices)
        else str(alias or f"TOOLFLEET_{name.upper()}")
    )
    value = error.get("input")
    shown = "" if any(w in name for w in _SECRET_WORDS) or isinstance(value, dict) else value
    told = f"={shown}" if shown not in ("", None) else ""
    return f"{variable}{told}: {error.get('msg', 'invalid')}"


@main.command()
def planner() -> None:
    """Plan model responses: dedupe, approvals, one command per call."""
    from planner.service import Planner

    settings = service_settings()
    run_service("planner", settings, lambda bus, stores: Planner(settings, bus=bus, stores=stores))


@main.command()
def aggregator() -> None:
    """Reassemble outcomes in model order into one TurnResult per turn."""
    from aggregator.service import Aggregator

    settings = service_settings()
    run_service(
        "aggregator", settings, lambda bus, stores: Aggregator(settings, bus=bus, stores=stores)
    )


@main.command()
def reconciler() -> None:
    """Resolve calls whose effect is unknown: probe, retry, compensate, or ask a human."""
    from reconciler.service import Reconciler

    settings = service_settings()
    run_service(
        "reconciler", settings, lambda bus, stores: Reconciler(settings, bus=bus, stores=stores)
    )


def _pool_name(_ctx: click.Context, _param: click.Parameter, value: str) -> str:
    if not _POOL.fullmatch(value):
        raise click.BadParameter(
            f"{value!r}: a pool names a Kafka topic (commands.<pool>): use 1 to 200 letters, "
            "digits, '.', '_' or '-'"
        )
    return value


_POOL = re.compile(r"[A-Za-z0-9._-]{1,200}")


@main.command()
@click.option("--tools", "tools_ref", required=True, help="module:attribute of a ToolRegistry")
@click.option(
    "--pool",
    default="default",
    show_default=True,
    callback=_pool_name,
    help="Worker pool to serve.",
)
@click.option(
    "--concurrency",
    type=click.IntRange(min=1),
    default=WorkerLimits.per_worker,
    show_default=True,
    help="Calls at once, per process, at least 1 (they count in the pool's capacity for "
    "admission).",
)
@click.option(
    "--lease-s",
    type=click.FloatRange(min=1.0),
    default=WorkerLimits.lease_s,
    show_default=True,
    help="Seconds a silent worker keeps a call, at least 1 (renewed every third of it).",
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

    try:
        registry = load_object(tools_ref)
    except (ConfigurationError, ImportError, AttributeError) as exc:
        raise click.BadParameter(str(exc), param_hint="'--tools'") from None
    if not isinstance(registry, ToolRegistry):
        raise click.BadParameter(
            f"{tools_ref} is a {type(registry).__name__}, not a ToolRegistry",
            param_hint="'--tools'",
        )
    limits = WorkerLimits(per_worker=concurrency, lease_s=lease_s)
    settings = service_settings()
    run_service(
        f"worker-{pool}",
        settings,
        lambda bus, stores: Worker(settings, registry, pool, limits, bus=bus, stores=stores),
        pools=(pool,),
    )


@main.command()
def demo() -> None:
    """Run a fleet on this machine and push one model response through it."""
    import asyncio

    from toolfleet.app.demo import run_demo

    asyncio.run(run_demo(service_settings()))


def load_object(reference: str) -> object:
    """Import ``module:attribute``; ConfigurationError (what to fix) when it cannot."""
    module_name, _, attribute = reference.partition(":")
    if not module_name or not attribute:
        raise ConfigurationError(f"expected module:attribute, got {reference!r}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        if isinstance(exc, ModuleNotFoundError) and (exc.name or "").split(".")[0] in _EXTRA_OF:
            raise  # an optional part of toolfleet: the group names the extra that installs it
        raise ConfigurationError(
            f"cannot import {module_name!r} ({exc}); is the package that defines your tools "
            "installed, or on PYTHONPATH?"
        ) from exc
    try:
        return getattr(module, attribute)
    except AttributeError:
        raise ConfigurationError(
            f"module {module_name!r} has no attribute {attribute!r}; name the ToolRegistry "
            "your tools are declared on"
        ) from None
