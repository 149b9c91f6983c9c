"""Which versions of a deployment's state a release reads and writes: the decisions, pure.

A deployment's state (its Redis keys, and the messages on its topics that services store)
has a version, the one *in force*, kept in the deployment's version marker (``Keys.schema``;
``kernel.stores.schema`` reads and writes it). Version 1 is the baseline release's
(``kernel/stores/baseline.toml``), which wrote no marker and no version field in any record:
a record without a version field, and a deployment without a marker that has run, are
version 1.

- A release reads every version from ``OLDEST_READ`` to ``STATE_VERSION``.
- It writes what the version in force lets it: while the marker says an earlier version
  (a rolling upgrade: the previous release's services may still run and read what this one
  writes), only what that version's readers accept; once ``toolfleet migrate --finish`` has
  raised the marker (every service runs this release), its own version.
- It refuses to start against a marker above ``STATE_VERSION`` (state a newer release wrote)
  or below ``OLDEST_READ`` (the release in between was skipped), saying what to do.
- ``toolfleet migrate`` (before the new services start) records the version of a deployment
  that has none and moves data forward only as far as the running release still reads;
  ``--finish`` (once no service of an earlier release runs) raises the version in force.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from schemas import LONG_RUNNING_SPEC_FIELDS, ExecutionCommand, ToolSpec

STATE_VERSION = 3
"""The state version this release writes once it is in force."""

OLDEST_READ = 1
"""The oldest state version this release reads: the baseline's."""

VERSIONS: dict[int, str] = {
    1: "the baseline release's state (no marker, no version field in any record)",
    2: "an agent run's context travels with its calls (ExecutionCommand.run_context and "
    "tool_call, CallOutcome.run_context, a TurnResult call's run_context); services of "
    "version 1 refuse messages that carry them",
    3: "tools that run for hours: a retry carries the heartbeat details of the call's earlier "
    "attempt (ExecutionCommand.heartbeat_details), and the tool registry publishes "
    "schedule-to-start and heartbeat timeouts (ToolSpec.schedule_to_start_s and "
    "heartbeat_timeout_s); services of version 2 refuse commands and specs that carry them. "
    "Deferred calls: the ledger state 'deferred' (a worker of version 2 would start such a "
    "call again), so a tool defers only once version 3 is in force",
}
"""What each state version brought, for ``toolfleet migrate`` and docs/upgrading.md."""

FEATURES: dict[str, int] = {"run_context": 2, "long_running": 3}
"""What a service writes only once a state version is in force: feature -> version."""

CLIENT_ID = re.compile(r"\.state(\d+)$")
"""A service's Kafka client id ends in ``.state<N>``, the state version of its release; an
id without it is a service of version 1 (the baseline). ``migrate --finish`` reads the
consumer groups' members by it."""


def client_id(service: str) -> str:
    """The Kafka client id of a service of this release."""
    return f"toolfleet-{service}.state{STATE_VERSION}"


def version_of_client(client: str) -> int:
    """The state version of the release a Kafka client id belongs to (1: no suffix)."""
    found = CLIENT_ID.search(client)
    return int(found.group(1)) if found else 1


def carries(in_force: int, feature: str) -> bool:
    """Whether a service writes ``feature`` when ``in_force`` is the version in force."""
    return min(in_force, STATE_VERSION) >= FEATURES[feature]


def for_readers(command: ExecutionCommand, in_force: int) -> ExecutionCommand:
    """``command`` as the workers of the version in force read it: until version 2 is in
    force, without the run context and the call item (a version-1 worker refuses them);
    until version 3 is, without the heartbeat details (a version-2 worker refuses them)."""
    update: dict[str, object] = {}
    if not carries(in_force, "run_context") and (
        command.run_context is not None or command.tool_call
    ):
        update |= {"run_context": None, "tool_call": None}
    if not carries(in_force, "long_running") and command.heartbeat_details is not None:
        update["heartbeat_details"] = None
    return command.model_copy(update=update) if update else command


def spec_for_readers(spec: ToolSpec, in_force: int) -> ToolSpec:
    """``spec`` as the services of the version in force read the registry: until version 3
    is in force, without its schedule-to-start and heartbeat timeouts (a version-2 service
    refuses a spec that has them; the worker that serves the tool applies them anyway)."""
    if carries(in_force, "long_running"):
        return spec
    unset = {name: None for name in LONG_RUNNING_SPEC_FIELDS if getattr(spec, name) is not None}
    return spec.model_copy(update=unset) if unset else spec


def record_version(raw: str | int | None) -> int:
    """The state version of one stored record: its version field (``v`` in a hash or a JSON
    object), 1 when it has none (every record of the baseline's format). A field that holds
    no positive integer is read as a version newer than any: refused, not guessed."""
    if raw is None or raw == "":
        return 1
    text = str(raw)
    return int(text) if text.isdigit() and int(text) >= 1 else 10**9


def newer_record(kind: str, version: int) -> str | None:
    """Why a record of ``version`` must not be read by this release; None when it may."""
    if version <= STATE_VERSION:
        return None
    shown = version if version < 10**9 else "unreadable"
    return (
        f"a {kind} of state version {shown} was written by a newer toolfleet; this release "
        f"reads versions {OLDEST_READ} to {STATE_VERSION}: run the release the deployment's "
        "state version marker names (`toolfleet migrate --dry-run` shows it)"
    )


@dataclass(frozen=True)
class Marker:
    """A deployment's version marker, as Redis holds it."""

    version: int
    """The state version in force."""
    by: str = ""
    """What set it (``toolfleet migrate``, a service starting on fresh state)."""
    at: float = 0.0
    """When it was set (Unix time)."""

    def fields(self) -> dict[str, str]:
        """The marker's hash fields."""
        return {"version": str(self.version), "by": self.by, "at": repr(self.at)}

    @classmethod
    def decode(cls, fields: Mapping[str, str]) -> Marker | None:
        """The marker a hash holds; None when there is none. ValueError when its version is
        no positive integer (someone wrote the key by hand)."""
        if "version" not in fields:
            return None
        raw = fields["version"]
        if not raw.isdigit() or int(raw) < 1:
            raise ValueError(
                f"the state version marker holds version {raw!r}, which is no state version: "
                "fix it by hand (`toolfleet migrate --dry-run` says what it should be)"
            )
        return cls(int(raw), fields.get("by", ""), float(fields.get("at") or 0.0))


def refusal(in_force: int) -> str | None:
    """Why a service or ``toolfleet migrate`` of this release must not run against state of
    version ``in_force``; None when it may."""
    if in_force > STATE_VERSION:
        return (
            f"this deployment's state is at version {in_force}, written by a newer toolfleet; "
            f"this release reads versions {OLDEST_READ} to {STATE_VERSION}. Run the release "
            f"that raised it (or a newer one): once `toolfleet migrate --finish` has raised "
            "the state version, an earlier release cannot be rolled back to"
        )
    if in_force < OLDEST_READ:
        return (
            f"this deployment's state is at version {in_force}; this release reads versions "
            f"{OLDEST_READ} to {STATE_VERSION}. Upgrade through the releases in between "
            "first, running each one's `toolfleet migrate --finish`"
        )
    return None


@dataclass(frozen=True)
class Start:
    """What a service does about the marker when it starts."""

    in_force: int
    """The version in force (what it writes, up to its own)."""
    refuse: str | None = None
    """Why it must not start; None: it may."""
    record: int | None = None
    """A marker to write first (fresh state: nothing older can be running)."""


def on_start(marker: Marker | None, *, used: bool) -> Start:
    """A service's decision at start. ``used``: the deployment has run (its tool registry
    exists), so a missing marker means the baseline's state."""
    if marker is None:
        if used:
            return Start(in_force=1)
        return Start(in_force=STATE_VERSION, record=STATE_VERSION)
    why = refusal(marker.version)
    return Start(in_force=marker.version, refuse=why)


@dataclass(frozen=True)
class Plan:
    """What ``toolfleet migrate`` does (or, with ``--dry-run``, would do)."""

    current: int | None
    """The version in force before (None: no marker)."""
    target: int | None
    """The version in force after (None: nothing is written)."""
    steps: list[str] = field(default_factory=list)
    """What it does, one line each, in order."""
    refuse: str | None = None
    """Why it does nothing; None when it may go ahead."""
    waiting_for: list[str] = field(default_factory=list)
    """Services of an earlier release still running (``--finish`` waits for them)."""


def plan(marker: Marker | None, *, used: bool, finish: bool, earlier: Sequence[str] = ()) -> Plan:
    """The migration for this release. ``used``: the deployment has run; ``finish``: raise
    the version in force to this release's; ``earlier``: the running services whose release
    writes an earlier state version (their consumer groups' members), which ``finish`` waits
    for."""
    current = None if marker is None else marker.version
    if current is None and not used:
        return Plan(None, STATE_VERSION, [f"fresh state: version {STATE_VERSION} in force"])
    known = 1 if current is None else current
    why = refusal(known)
    if why is not None:
        return Plan(current, None, refuse=why)
    steps = []
    if current is None:
        steps.append("no version marker: the baseline's state, version 1, recorded")
    steps += _moves(known)
    if not finish:
        if known < STATE_VERSION:
            steps.append(
                f"version {known} stays in force while services of the earlier release run; "
                "once every service runs this release: toolfleet migrate --finish"
            )
        return Plan(current, 1 if current is None else None, steps)
    if known == STATE_VERSION:
        return Plan(current, None, [*steps, f"version {STATE_VERSION} already in force"])
    if earlier:
        names = ", ".join(sorted(earlier))
        why = (
            f"services of an earlier release still run ({names}): finish the rollout first "
            f"(they write state version {known}); `--wait SECONDS` waits for them"
        )
        return Plan(current, None, steps, refuse=why, waiting_for=sorted(earlier))
    raised = [f"version {v} in force: {VERSIONS[v]}" for v in range(known + 1, STATE_VERSION + 1)]
    return Plan(current, STATE_VERSION, [*steps, *raised])


def _moves(version: int) -> list[str]:
    """The data moves from ``version`` to this release's. None so far: versions 2 and 3
    changed no record already written (earlier records are read as they are)."""
    if version >= STATE_VERSION:
        return []
    return [f"records of version {version} are read as they are: no data to move"]
