"""``toolfleet migrate``: move a deployment's state to this release's version, in place.

Run it before this release's services start (the chart's pre-upgrade Job): it records the
version of state that has no marker and moves data only as far as the running release still
reads, so the upgrade can roll one service at a time with calls in flight. Run it with
``--finish`` once every service runs this release (the chart's post-upgrade Job): it raises
the version in force, and the services write what only this release reads (within
``state_version_refresh_s``). Both are idempotent: run again, they find the work done, and an
interrupted run is finished by the next one. ``kernel.rules.state_versions`` decides.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import click
from aiokafka.admin import AIOKafkaAdminClient

from kernel.adapters.redis import connect_redis
from kernel.adapters.security import kafka_options
from kernel.errors import UsageError
from kernel.rules.state_versions import (
    OLDEST_READ,
    STATE_VERSION,
    Marker,
    Plan,
    plan,
    version_of_client,
)
from kernel.settings import Settings
from kernel.stores.keys import Keys
from kernel.stores.schema import StateSchema

WAIT_STEP_S = 2.0
"""How often ``--finish --wait`` looks again at the services still running."""


async def earlier_services(settings: Settings) -> list[str]:
    """The members of the deployment's consumer groups (every service instance) whose
    release writes an earlier state version than this one, as ``group: client id``."""
    admin = AIOKafkaAdminClient(**kafka_options(settings))
    await admin.start()
    try:
        prefix = settings.topic_prefix
        groups = [g[0] for g in await admin.list_consumer_groups() if g[0].startswith(prefix)]
        # One group per request: aiokafka 0.14 misreads a reply that describes several.
        replies = await asyncio.gather(*(admin.describe_consumer_groups([g]) for g in groups))
        found = []
        for reply in (r for rs in replies for r in rs):
            described: dict[str, Any] = reply.to_object()
            for group in described["groups"]:
                for member in group["members"]:
                    client = str(member["client_id"])
                    if version_of_client(client) < STATE_VERSION:
                        found.append(f"{group['group'].removeprefix(prefix)}: {client}")
        return found
    finally:
        await admin.close()


async def run_migration(
    settings: Settings, *, finish: bool, dry_run: bool, wait_s: float, say: Any = click.echo
) -> Plan:
    """Plan the migration and, unless ``dry_run``, carry it out; says what it does."""
    redis = connect_redis(settings)
    schema = StateSchema(redis, Keys.of(settings))
    try:
        marker = await schema.marker()
        used = await schema.used()
        say(f"state {Keys.of(settings).namespace}: {_describe(marker, used)}")
        say(f"this release reads state versions {OLDEST_READ} to {STATE_VERSION}")
        deadline = time.monotonic() + wait_s
        while True:
            earlier = await earlier_services(settings) if finish else []
            decided = plan(marker, used=used, finish=finish, earlier=earlier)
            if not decided.waiting_for or dry_run or time.monotonic() >= deadline:
                break
            say(f"waiting for {len(decided.waiting_for)} service(s) of an earlier release")
            await asyncio.sleep(WAIT_STEP_S)  # wait-ok: a rollout's pace, bounded by --wait
        for step in decided.steps:
            say(f"  {step}")
        if decided.refuse is not None:
            for service in decided.waiting_for:
                say(f"  still running: {service}")
            raise UsageError(decided.refuse)
        if dry_run:
            say("dry run: nothing written")
            return decided
        if decided.target is not None and decided.target != decided.current:
            by = "toolfleet migrate --finish" if finish else "toolfleet migrate"
            await schema.write(Marker(decided.target, by=by, at=time.time()))
            say(f"done: state version {decided.target} in force")
        else:
            say("done: nothing to write")
        return decided
    finally:
        await redis.aclose()


def _describe(marker: Marker | None, used: bool) -> str:
    if marker is not None:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(marker.at)) if marker.at else "?"
        return f"version {marker.version} in force (set by {marker.by or '?'}, {when} UTC)"
    if used:
        return "no version marker (the baseline release's state, version 1)"
    return "fresh (nothing written yet)"


@click.command()
@click.option(
    "--finish",
    is_flag=True,
    help="Raise the state version in force to this release's; refused while a service of an "
    "earlier release runs (the chart runs it after the rollout).",
)
@click.option("--dry-run", is_flag=True, help="Say what it would do; write nothing.")
@click.option(
    "--wait",
    "wait_s",
    type=float,
    default=0.0,
    show_default=True,
    help="With --finish: wait up to this many seconds for services of an earlier release to stop.",
)
def migrate(finish: bool, dry_run: bool, wait_s: float) -> None:
    """Move the deployment's state to this release's version (idempotent; before the new
    services start, and with --finish once they all run)."""
    try:
        asyncio.run(run_migration(Settings(), finish=finish, dry_run=dry_run, wait_s=wait_s))
    except UsageError as exc:
        raise click.ClickException(str(exc)) from None
