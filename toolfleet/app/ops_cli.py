"""Operator commands: ``toolfleet tasks``, ``inspect``, ``tools``, ``tenants`` and ``topics``."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, cast

import click
from redis.asyncio import Redis

from kernel.adapters.bus import KafkaBus
from kernel.adapters.redis import connect_redis
from kernel.adapters.topics import apply_topics, plan_topics, strimzi_topics
from kernel.errors import UsageError
from kernel.rules.effects import Budgets, attendance, needs_review, review_rows
from kernel.rules.versions import version_ref
from kernel.settings import Settings
from kernel.stores.admission import Admission, Limits
from kernel.stores.circuit import task_call_ref
from kernel.stores.keys import Keys
from kernel.stores.registry import ToolDirectory
from kernel.stores.schema import StateSchema
from schemas import AgentRef, ModelResponseEvent, ToolfleetError, ToolSpec
from toolfleet.app import operations

T = TypeVar("T")


def _with_redis(work: Callable[[Redis, Settings], Awaitable[T]]) -> T:
    """Run ``work`` with a Redis connection; an operation's refusal becomes the command's
    error message (``toolfleet.app.operations`` raises UsageErrors that say what to fix)."""

    async def main() -> T:
        settings = Settings()
        redis = connect_redis(settings)
        try:
            # State a newer release wrote is refused before it is read (or misread).
            await StateSchema(redis, Keys.of(settings)).check_readable()
            return await work(redis, settings)
        finally:
            await redis.aclose()

    try:
        return asyncio.run(main())
    except UsageError as exc:
        raise click.ClickException(str(exc)) from None


@click.group()
def tasks() -> None:
    """Human tasks: calls automation could not settle, compensations, open circuits."""


@tasks.command("list")
@click.option("--all", "show_all", is_flag=True, help="Include resolved tasks.")
def list_tasks(show_all: bool) -> None:
    """List open (or all) human tasks, oldest first."""

    async def work(redis: Redis, settings: Settings) -> None:
        for stored in await operations.list_tasks(redis, settings, include_resolved=show_all):
            t = stored.task
            age = time.time() - t.created_at
            subject = t.call_id or f"{t.tool_name}@{t.tool_version}"
            if t.call_id and t.run_id:  # a call id is unique only within its run
                subject = task_call_ref(t.run_id, t.call_id)
            click.echo(f"{t.task_id}  {stored.status:8}  {t.kind:21}  {subject}  ({age:.0f} s)")
            click.echo(f"    {t.reason}")
            if t.calls:  # a circuit's: run/call each (the task's tenant is theirs)
                click.echo(f"    calls: {', '.join(t.calls)}")

    _with_redis(work)


@tasks.command("resolve")
@click.argument("task_id")
@click.option(
    "--as",
    "resolution",
    required=True,
    type=click.Choice(operations.RESOLUTIONS),
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
        bus = KafkaBus(settings, service="cli")
        await bus.start()
        try:
            answer = cast(operations.Resolution, resolution)  # one of click's choices
            await operations.resolve_task(
                redis, bus, settings, task_id, answer, decided_by=decided_by, output=output,
                note=note,
            )  # fmt: skip
        finally:
            await bus.stop()
        click.echo(f"sent: {task_id} -> {resolution}")

    _with_redis(work)


@click.group()
def calls() -> None:
    """Act on calls."""


@calls.command("complete")
@click.argument("call_id")
@click.option("--tenant", required=True, help="The call's tenant.")
@click.option(
    "--run", "run_id", default="", help="The call's run (not needed with tenant identity scope)."
)
@click.option(
    "--effect",
    type=click.Choice(["applied", "not_executed", "unknown"]),
    default="applied",
    show_default=True,
    help="What became of the work the call handed over.",
)
@click.option("--output", default=None, help="What the model is shown.")
@click.option("--by", "completed_by", required=True, help="Who completes it (for the audit).")
def complete_call(
    *, call_id: str, tenant: str, run_id: str, effect: str, output: str | None, completed_by: str
) -> None:
    """Complete a deferred call by hand, as the external system it waits for would."""

    async def work(redis: Redis, settings: Settings) -> None:
        bus = KafkaBus(settings, service="cli")
        await bus.start()
        try:
            await operations.complete_call(
                redis, bus, settings, tenant, call_id, run_id=run_id,
                effect=cast(operations.CompletionEffect, effect),
                output=output, completed_by=completed_by,
            )  # fmt: skip
        finally:
            await bus.stop()
        click.echo(f"sent: completion of {call_id} ({effect})")

    _with_redis(work)


@click.group()
def inspect() -> None:
    """Look into the ledger."""


@inspect.command("call")
@click.argument("call_id")
@click.option("--tenant", required=True, help="The call's tenant.")
@click.option(
    "--run", "run_id", default="", help="The call's run (not needed with tenant identity scope)."
)
def inspect_call(call_id: str, tenant: str, run_id: str) -> None:
    """Print a call's ledger entry and its audit chain."""

    async def work(redis: Redis, settings: Settings) -> None:
        view = await operations.read_call(redis, settings, tenant, run_id, call_id)
        click.echo(json.dumps(view.fields, indent=2, default=str))
        if view.entry.outcome is not None:
            click.echo("outcome: " + view.entry.outcome.model_dump_json(exclude_none=True))
        click.echo("audit chain:")
        for event in view.audit:
            at = time.strftime("%H:%M:%S", time.localtime(event.pop("at", 0)))
            click.echo(f"  {at}  {event.pop('event')}  {json.dumps(event, default=str)}")

    _with_redis(work)


@click.group()
def approvals() -> None:
    """Calls waiting for an operator's approval, and the decisions on them."""


@approvals.command("list")
@click.option("--tenant", default=None, help="Only this tenant's calls.")
def list_approvals(tenant: str | None) -> None:
    """Calls waiting for approval, the longest waiting first (arguments as their digest)."""

    async def work(redis: Redis, settings: Settings) -> None:
        for pending in await operations.pending_approvals(redis, settings, tenant=tenant):
            e, decision = pending.entry, pending.decision
            click.echo(f"{e.call_id}  {e.tool_name}  tenant={e.tenant_id}  run={e.run_id}")
            click.echo(f"    arguments sha256: {e.arguments_digest}")
            if decision is not None:
                verdict = "approved" if decision.get("approve") else "rejected"
                click.echo(f"    {verdict} by {decision.get('by')}; waiting for the turn's resume")

    _with_redis(work)


def _decision_options(func: Callable[..., Any]) -> Callable[..., Any]:
    for option in reversed(
        [
            click.argument("call_id"),
            click.option("--tenant", required=True, help="The call's tenant."),
            click.option("--run", "run_id", required=True, help="The call's run."),
            click.option("--by", "decided_by", required=True,
                         help="Who decides (kept in the audit chain)."),
        ]
    ):  # fmt: skip
        func = option(func)
    return func


def _decide(call_id: str, tenant: str, run_id: str, decided_by: str, **decision: Any) -> None:
    async def work(redis: Redis, settings: Settings) -> None:
        bus = KafkaBus(settings, service="cli")
        await bus.start()
        try:
            await operations.decide_approval(
                redis, bus, settings, tenant_id=tenant, run_id=run_id, call_id=call_id,
                decided_by=decided_by, **decision,
            )  # fmt: skip
        finally:
            await bus.stop()
        click.echo(f"sent: {call_id} -> {'approved' if decision['approve'] else 'rejected'}")

    _with_redis(work)


@approvals.command("approve")
@_decision_options
def approve_call(call_id: str, tenant: str, run_id: str, decided_by: str) -> None:
    """Approve a call waiting for approval; the agent runtime's resumed turn then runs it."""
    _decide(call_id, tenant, run_id, decided_by, approve=True)


@approvals.command("reject")
@_decision_options
@click.option("--message", default=None, help="What the model sees instead of an output.")
def reject_call(
    call_id: str, tenant: str, run_id: str, decided_by: str, message: str | None
) -> None:
    """Reject a call waiting for approval; the resumed turn tells the model it was rejected."""
    _decide(call_id, tenant, run_id, decided_by, approve=False, message=message)


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
        _print_review(spec, settings)

    _with_redis(work)


@tools.command("review")
def review_tools() -> None:
    """The review material of every served tool; exits 1 if one runs unattended without a
    probe and without a recorded reason."""

    async def work(redis: Redis, settings: Settings) -> list[str]:
        specs = await ToolDirectory(redis, Keys.of(settings)).specs()
        flagged = []
        for spec in sorted(specs.values(), key=lambda s: s.lookup_key):
            _print_review(spec, settings)
            click.echo("")
            if needs_review(spec):
                flagged.append(spec.lookup_key)
        return flagged

    flagged = _with_redis(work)
    if flagged:
        click.echo(
            f"{len(flagged)} tool(s) run unattended without a probe: {', '.join(flagged)}. "
            "Declare a probe, require approval, or record why with unattended='...'.",
            err=True,
        )
        raise SystemExit(1)


def _print_review(spec: ToolSpec, settings: Settings) -> None:
    unattended, why = attendance(spec)
    definite = ", ".join(spec.definite_errors) or "none"
    click.echo(
        f"{spec.lookup_key}@{spec.version}  pool={spec.pool}  effect={spec.effect_class}"
        f"{'' if spec.effect_declared else ' (undeclared)'}  "
        f"needs_approval={spec.needs_approval}  on_unknown={spec.on_unknown}  "
        f"probe={'yes' if spec.has_probe else 'no'}  "
        f"compensate={'yes' if spec.has_compensate else 'no'}"
    )
    click.echo(f"  runs unattended: {'yes' if unattended else 'no'} ({why})")
    click.echo(
        f"  definite errors: {definite}; classify hook: {'yes' if spec.has_classify else 'no'}"
    )
    click.echo(f"  timeouts: {_timeouts(spec)}")
    rows = [("signal", "effect", "may have applied", "first action", "forbidden",
             "human takes over")]  # fmt: skip
    rows += [
        (r.signal, r.effect, r.may_have_applied, r.first_action, r.forbidden, r.human)
        for r in review_rows(spec, _budgets(settings))
    ]
    for row in rows:
        click.echo("  " + " | ".join(row))


def _timeouts(spec: ToolSpec) -> str:
    """Temporal's kinds, as the tool declared them ('none' for one it did not)."""

    def seconds(value: float | None) -> str:
        return "none" if value is None else f"{value:g} s"

    return (
        f"schedule-to-start {seconds(spec.schedule_to_start_s)}, start-to-close "
        f"{seconds(spec.timeout_s)}, heartbeat {seconds(spec.heartbeat_timeout_s)}"
    )


def _budgets(settings: Settings) -> Budgets:
    return Budgets(
        max_attempts=settings.recovery_max_attempts,
        probe_budget=settings.recovery_probe_budget,
        circuit_error_rate=settings.circuit_error_rate,
        circuit_window_s=settings.circuit_window_s,
    )


@tools.command("resume")
@click.argument("ref", metavar="NAME@VERSION")
def resume_tool(ref: str) -> None:
    """Close an open circuit (after reconciling the calls its task lists)."""

    async def work(redis: Redis, settings: Settings) -> None:
        closed = await operations.resume_circuit(redis, settings, ref)
        click.echo(f"{ref}: {'closed' if closed else 'was not open'}")

    _with_redis(work)


@tools.command("circuits")
def list_circuits() -> None:
    """List open circuits."""

    async def work(redis: Redis, settings: Settings) -> None:
        for ref, state in (await operations.open_circuits(redis, settings)).items():
            click.echo(f"{ref}: open since {time.ctime(state['opened_at'])}, "
                       f"{state['failed']:.0f} of {state['calls']:.0f} calls failed")  # fmt: skip

    _with_redis(work)


@tools.command("versions")
@click.argument("name")
def list_versions(name: str) -> None:
    """A tool's live versions, which one new calls go to and why, its pin and circuits."""

    async def work(redis: Redis, settings: Settings) -> None:
        view = await operations.tool_versions(redis, settings, name)
        choice, auto = view.choice, view.auto_rollback
        click.echo(f"new calls: {choice.describe()}")
        click.echo(f"pin: {view.pin or 'none'}  automatic rollback: {'on' if auto else 'off'}")
        for version_view in view.versions:
            version, spec, state = version_view.version, version_view.spec, version_view.circuit
            circuit = (
                f"open ({state['failed']:.0f} of {state['calls']:.0f} calls failed)"
                if state is not None
                else "closed"
            )
            marker = "  <- new calls" if version == choice.version else ""
            click.echo(
                f"  {version_ref(name, version)}  pool={spec.pool}  effect={spec.effect_class}  "
                f"circuit={circuit}{marker}"
            )

    _with_redis(work)


@tools.command("rollback")
@click.argument("name")
@click.option("--to", "version", required=True, help="A live version of NAME.")
def rollback_tool(name: str, version: str) -> None:
    """Send new calls of NAME to an earlier VERSION (a pin, until `toolfleet tools unpin`).

    Calls the failing version made stay on its circuit's human task until reconciled.
    """
    _with_redis(lambda redis, settings: _pin(redis, settings, name, version))


@tools.command("pin")
@click.argument("name")
@click.argument("version")
def pin_tool(name: str, version: str) -> None:
    """Send every new call of NAME to VERSION, whatever its circuit says, until unpinned."""
    _with_redis(lambda redis, settings: _pin(redis, settings, name, version))


@tools.command("unpin")
@click.argument("name")
def unpin_tool(name: str) -> None:
    """Drop NAME's pin: new calls go to the newest healthy live version again."""

    async def work(redis: Redis, settings: Settings) -> None:
        unpinned = await operations.unpin_tool(redis, settings, name)
        click.echo(f"{name}: {'unpinned' if unpinned else 'was not pinned'}")

    _with_redis(work)


async def _pin(redis: Redis, settings: Settings, name: str, version: str) -> None:
    """Pin ``name`` to a live ``version``; the ledger and human tasks are left as they are."""
    click.echo(await operations.pin_tool(redis, settings, name, version))


# --- quotas, weights and rate limits (admission) ----------------------------------------------
def _rate(value: str | None) -> float | None:
    """``100/s``, ``6000/min`` or a plain number of calls per second."""
    if value is None:
        return None
    number, _, unit = value.partition("/")
    per = {"": 1.0, "s": 1.0, "min": 60.0, "h": 3600.0}.get(unit)
    try:
        rate = float(number) / per if per else -1.0
    except ValueError:
        rate = -1.0
    if rate <= 0:
        raise click.BadParameter(f"a rate is N/s, N/min or N/h with N > 0, got {value!r}")
    return rate


def _limit_options(func: Callable[..., Any]) -> Callable[..., Any]:
    for option in reversed(
        [
            click.option("--max-concurrency", type=click.IntRange(min=1), default=None,
                         help="Calls admitted at once, fleet-wide."),
            click.option("--rate", default=None, help="Calls started per second: 100/s, 600/min."),
            click.option("--burst", type=click.IntRange(min=1), default=None,
                         help="Calls the rate bucket holds (default 1: evenly spaced)."),
            click.option("--clear", is_flag=True, help="Remove every limit first."),
        ]
    ):  # fmt: skip
        func = option(func)
    return func


@click.group()
def tenants() -> None:
    """Tenants' quotas, weights and rate limits (applied by the planners' admission, live)."""


@tenants.command("set")
@click.argument("tenant")
@_limit_options
@click.option("--weight", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Share of capacity among tenants with waiting calls (default 1).")  # fmt: skip
def set_tenant(tenant: str, clear: bool, rate: str | None, **limits: Any) -> None:
    """Set TENANT's limits; what is not given keeps its value (or the settings' default)."""

    async def work(redis: Redis, settings: Settings) -> None:
        new = await operations.set_limits(
            redis, settings, "tenants", tenant, clear=clear, rate=_rate(rate), **limits
        )
        click.echo(f"{tenant}: {_describe(new)}")

    _with_redis(work)


@tenants.command("list")
def list_tenants() -> None:
    """Every configured or busy tenant: its limits, calls admitted now, waiting, in total."""

    async def work(redis: Redis, settings: Settings) -> None:
        admission = Admission.of(redis, Keys.of(settings), settings)
        click.echo(f"defaults: {_describe(admission.default_tenant)}")
        click.echo(f"{'tenant':<24} {'running':>8} {'waiting':>8} {'admitted':>9}  limits")
        for view in await admission.tenants():
            click.echo(f"{view.tenant_id:<24} {view.running:>8} {view.waiting:>8} "
                       f"{view.admitted_total:>9}  {_describe(view.limits)}")  # fmt: skip

    _with_redis(work)


@tools.command("limit")
@click.argument("name")
@_limit_options
@click.option("--tenant-rate", default=None, help="Calls per second per tenant (an API key's).")
@click.option("--tenant-burst", type=click.IntRange(min=1), default=None)
def limit_tool(
    name: str, clear: bool, rate: str | None, tenant_rate: str | None, **limits: Any
) -> None:
    """Set the limits of tool NAME (its lookup key); live at once."""

    async def work(redis: Redis, settings: Settings) -> None:
        new = await operations.set_limits(
            redis,
            settings,
            "tools",
            name,
            clear=clear,
            rate=_rate(rate),
            tenant_rate=_rate(tenant_rate),
            **limits,
        )
        click.echo(f"{name}: {_describe(new)}")

    _with_redis(work)


@tools.command("limits")
def list_tool_limits() -> None:
    """Every tool with limits, and each pool's capacity (its live workers' slots)."""

    async def work(redis: Redis, settings: Settings) -> None:
        admission = Admission.of(redis, Keys.of(settings), settings)
        for pool, slots in sorted((await admission.pool_capacity(time.time())).items()):
            click.echo(f"pool {pool}: {slots} slots")
        for tool, limits in sorted((await admission.limits("tools")).items()):
            click.echo(f"{tool}: {_describe(limits)}")

    _with_redis(work)


def _describe(limits: Limits) -> str:
    parts = [f"{k.replace('_', '-')}={v:g}" for k, v in limits.__dict__.items() if v is not None]
    return " ".join(parts) or "no limits"


@click.group()
def topics() -> None:
    """The Kafka topics a deployment needs: print the plan, or create what is missing."""


_POOLS = click.option(
    "--pool",
    "pools",
    multiple=True,
    default=("default",),
    show_default=True,
    help="A worker pool of the deployment (repeat for each); its commands topic is planned.",
)


@topics.command("plan")
@_POOLS
@click.option("--strimzi", "cluster", default=None, help="Print Strimzi KafkaTopic resources "
              "for the Kafka cluster of this name instead of a table.")  # fmt: skip
@click.option("--namespace", default=None, help="The namespace of the KafkaTopic resources.")
def plan_command(pools: tuple[str, ...], cluster: str | None, namespace: str | None) -> None:
    """Print every topic: name, partitions, replication factor, configs (from the settings:
    TOOLFLEET_TOPIC_PREFIX, _PARTITIONS, _TOPIC_PARTITIONS, _REPLICATION_FACTOR,
    _TOPIC_REPLICATION_FACTORS)."""
    plan = plan_topics(Settings(), pools)
    if cluster is not None:
        click.echo(strimzi_topics(plan, cluster=cluster, namespace=namespace), nl=False)
        return
    width = max(len(t.name) for t in plan)
    click.echo(f"{'topic':<{width}}  partitions  replicas  configs")
    for t in plan:
        configs = ",".join(f"{k}={v}" for k, v in t.configs.items()) or "-"
        click.echo(f"{t.name:<{width}}  {t.partitions:>10}  {t.replication_factor:>8}  {configs}")


@topics.command("apply")
@_POOLS
def apply_command(pools: tuple[str, ...]) -> None:
    """Create the planned topics that are missing; exit 1 if an existing one differs."""
    report = asyncio.run(apply_topics(Settings(), pools))
    for name in report.created:
        click.echo(f"created  {name}")
    for name in report.existing:
        click.echo(
            f"exists   {name}"
            + (f"  ({report.different[name]})" if name in report.different else "")
        )
    if report.different:
        raise click.ClickException(
            "some topics differ from the plan (partitions can only be raised, and raising "
            "them moves keys to other partitions: drain first)"
        )


@click.command()
@click.option("--within", default=60.0, show_default=True, help="Seconds to wait for the result.")
@click.option("--tenant", default="smoke", show_default=True, help="Tenant of the turn.")
def smoke(within: float, tenant: str) -> None:
    """Submit one turn without calls and wait for its result: the planner, Kafka, Redis and
    the aggregator answer end to end (the chart's `helm test`)."""
    from toolfleet.client import FleetClient

    async def main() -> str:
        began = time.monotonic()
        async with FleetClient(Settings()) as client:
            event = ModelResponseEvent(
                tenant_id=tenant,
                run_id=f"smoke-{uuid.uuid4().hex[:12]}",
                turn_id=0,
                agent=AgentRef(name="smoke"),
                response_id="smoke",
            )
            result = await client.run_turn(event, within=within)
        return f"turn {event.run_id}: {result.status} in {time.monotonic() - began:.1f} s"

    try:
        click.echo(asyncio.run(main()))
    except ToolfleetError as exc:
        raise click.ClickException(str(exc)) from None
