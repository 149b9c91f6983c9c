"""Operator commands: ``toolfleet tasks``, ``toolfleet inspect``, ``toolfleet tools``."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import click
from redis.asyncio import Redis

from reconciler._policy import REPLAY_SAFE
from schemas import TaskResolution, ToolSpec
from toolfleet.bus import KafkaBus
from toolfleet.circuit import CircuitBreaker
from toolfleet.keys import Keys
from toolfleet.ledger import Ledger
from toolfleet.redis import connect_redis
from toolfleet.registry import ToolDirectory
from toolfleet.settings import Settings
from toolfleet.tasks import TaskStore

T = TypeVar("T")


def _with_redis(work: Callable[[Redis, Settings], Awaitable[T]]) -> T:
    async def main() -> T:
        settings = Settings()
        redis = connect_redis(settings)
        try:
            return await work(redis, settings)
        finally:
            await redis.aclose()

    return asyncio.run(main())


@click.group()
def tasks() -> None:
    """Human tasks: calls automation could not settle, compensations, open circuits."""


@tasks.command("list")
@click.option("--all", "show_all", is_flag=True, help="Include resolved tasks.")
def list_tasks(show_all: bool) -> None:
    """List open (or all) human tasks, oldest first."""

    async def work(redis: Redis, _settings: Settings) -> None:
        for stored in await TaskStore(redis, Keys.of(_settings)).all():
            if stored.status == "resolved" and not show_all:
                continue
            t = stored.task
            age = time.time() - t.created_at
            subject = t.call_id or f"{t.tool_name}@{t.tool_version}"
            click.echo(f"{t.task_id}  {stored.status:8}  {t.kind:21}  {subject}  ({age:.0f} s)")
            click.echo(f"    {t.reason}")
            if t.calls:
                click.echo(f"    calls: {', '.join(t.calls)}")

    _with_redis(work)


@tasks.command("resolve")
@click.argument("task_id")
@click.option(
    "--as",
    "resolution",
    required=True,
    type=click.Choice(
        ["applied", "not_applied", "wrong_effect", "approve_compensation", "reject_compensation"]
    ),
    help="What the operator found or decided.",
)
@click.option("--output", default=None, help="For applied: the output the model should see.")
@click.option("--note", default=None, help="Kept in the call's audit chain.")
@click.option("--by", "decided_by", required=True, help="Who decides (kept in the audit).")
def resolve_task(
    task_id: str, resolution: str, output: str | None, note: str | None, decided_by: str
) -> None:
    """Answer a human task; the reconciler carries the answer out."""

    async def work(redis: Redis, settings: Settings) -> None:
        stored = await TaskStore(redis, Keys.of(settings)).get(task_id)
        if stored is None:
            raise click.ClickException(f"no task {task_id}; see `toolfleet tasks list`")
        message = TaskResolution(
            tenant_id=stored.task.tenant_id,
            task_id=task_id,
            resolution=resolution,
            output=output,
            note=note,
            decided_by=decided_by,
        )
        bus = KafkaBus(settings, service="cli")
        await bus.start()
        try:
            await bus.publish_and_wait("task-resolutions", stored.task.run_id or task_id, message)
        finally:
            await bus.stop()
        click.echo(f"sent: {task_id} -> {resolution}")

    _with_redis(work)


@click.group()
def inspect() -> None:
    """Look into the ledger."""


@inspect.command("call")
@click.argument("call_id")
@click.option("--tenant", required=True, help="The call's tenant.")
def inspect_call(call_id: str, tenant: str) -> None:
    """Print a call's ledger entry and its audit chain."""

    async def work(redis: Redis, _settings: Settings) -> None:
        ledger = Ledger(redis, Keys.of(_settings), _settings.ledger_retention_s)
        entry = (await ledger.read(tenant, [call_id])).get(call_id)
        if entry is None:
            raise click.ClickException(f"no call {call_id} for tenant {tenant}")
        fields: dict[str, Any] = {
            k: v for k, v in vars(entry).items() if k not in ("outcome", "arguments")
        }
        click.echo(json.dumps(fields, indent=2, default=str))
        if entry.outcome is not None:
            click.echo("outcome: " + entry.outcome.model_dump_json(exclude_none=True))
        click.echo("audit chain:")
        for event in await ledger.audit(tenant, call_id):
            at = time.strftime("%H:%M:%S", time.localtime(event.pop("at", 0)))
            click.echo(f"  {at}  {event.pop('event')}  {json.dumps(event, default=str)}")

    _with_redis(work)


@click.group()
def tools() -> None:
    """Tools published by worker pools."""


@tools.command("describe")
@click.argument("name")
def describe_tool(name: str) -> None:
    """Print a tool's failure table: signals, whether each may have applied, what happens."""

    async def work(redis: Redis, settings: Settings) -> None:
        spec = (await ToolDirectory(redis, Keys.of(settings)).specs(needed=[name])).get(name)
        if spec is None:
            raise click.ClickException(f"no tool {name} in the registry; is its pool running?")
        click.echo(
            f"{spec.lookup_key}@{spec.version}  pool={spec.pool}  effect={spec.effect_class}  "
            f"needs_approval={spec.needs_approval}  on_unknown={spec.on_unknown}  "
            f"probe={'yes' if spec.has_probe else 'no'}  "
            f"compensate={'yes' if spec.has_compensate else 'no'}"
        )
        rows = failure_table(spec, settings)
        width = [max(len(r[i]) for r in rows) for i in range(3)]
        for row in rows:
            click.echo("  ".join(cell.ljust(width[i]) for i, cell in enumerate(row[:3])) + "  "
                       + row[3])  # fmt: skip

    _with_redis(work)


@tools.command("resume")
@click.argument("ref", metavar="NAME@VERSION")
def resume_tool(ref: str) -> None:
    """Close an open circuit (after reconciling the calls its task lists)."""

    async def work(redis: Redis, settings: Settings) -> None:
        closed = await CircuitBreaker(redis, settings).close(ref)
        click.echo(f"{ref}: {'closed' if closed else 'was not open'}")

    _with_redis(work)


@tools.command("circuits")
def list_circuits() -> None:
    """List open circuits."""

    async def work(redis: Redis, settings: Settings) -> None:
        for ref, state in (await CircuitBreaker(redis, settings).open_circuits()).items():
            click.echo(f"{ref}: open since {time.ctime(state['opened_at'])}, "
                       f"{state['failed']:.0f} of {state['calls']:.0f} calls failed")  # fmt: skip

    _with_redis(work)


def failure_table(spec: ToolSpec, settings: Settings) -> list[tuple[str, str, str, str]]:
    """(signal, may have applied, recovery action, human takeover point) for one tool."""
    safe = spec.effect_class in REPLAY_SAFE
    retry = (
        f"retry, same idempotency key, up to {settings.recovery_max_attempts} attempts"
        if safe
        else "none automatic (not replay-safe)"
    )
    if spec.effect_class == "read_only":
        unknown_action, unknown_human = "treated as not applied; " + retry, "never"
    elif spec.has_probe:
        unknown_action = (
            f"probe by idempotency key (up to {settings.recovery_probe_budget} probes): "
            f"applied -> resolved; not applied -> {retry}"
        )
        unknown_human = "probe budget spent, or not applied and not replay-safe"
    else:
        unknown_action, unknown_human = "no probe declared", "at once"
    compensation = (
        "compensate after approval, linked in the audit chain"
        if spec.has_compensate
        else "no compensate action declared"
    )
    maybe = "no" if spec.effect_class == "read_only" else "maybe"
    return [
        ("signal", "may have applied", "recovery", "human takes over"),
        ("invalid arguments / guardrail / approval rejected", "no", "none (model is told)",
         "never"),
        ("tool raised an error", "no", "none (model is told)", "never"),
        ("timeout", maybe, unknown_action, unknown_human),
        ("worker lost (lease expired)", maybe, unknown_action, unknown_human),
        ("broker error after start", maybe, unknown_action, unknown_human),
        ("wrong effect (operator)", "yes", compensation, "approval of the compensation"),
        (f"error rate >= {settings.circuit_error_rate:.0%} over {settings.circuit_window_s:g} s",
         "-", "circuit opens: later calls not executed", "task lists the calls to reconcile"),
    ]  # fmt: skip
