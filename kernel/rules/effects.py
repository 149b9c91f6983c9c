"""What counts as "happened": the one home of every rule that judges a call's effect.

A failure is a transport signal; it proves nothing about the business effect unless it says
so. This module decides, for every signal a call can end with, the effect (``not_executed``,
``unknown``, ``applied``, ``wrong_effect``) and whether trying again can help (``transient``,
``permanent``), and the few rules built on that verdict: which outcome settles a turn's call or
fails the turn, what counts against a tool version's circuit, when the fleet retries, what a
probe's answer means, and which tools must wait for a human (the release gate). Services call
these functions; none of them re-derives a rule.

Pure: no I/O, no clock, no randomness of its own (callers pass ``now`` and ``jitter``).
Library exceptions (httpx, aiohttp, requests, urllib3, httpcore) are recognised by class name
and module, so none of those libraries is a dependency.
"""

from __future__ import annotations

import asyncio
import dataclasses
import email.utils
import socket
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from kernel.errors import ToolfleetError
from kernel.rules.backoff import Backoff
from schemas import Effect, EffectClass, RetryHint

ProbeAnswer = Literal["applied", "not_applied", "unknown", "wrong_effect"]
"""What a tool's probe found upstream for an idempotency key."""

REPLAY_SAFE: frozenset[str] = frozenset({"read_only", "idempotent"})
"""Effect classes whose calls may be submitted again with the same idempotency key."""

GATED: frozenset[str] = frozenset({"non_idempotent", "irreversible"})
"""Effect classes that run unattended only with a probe (the release gate)."""

RETRYABLE_STATUS_CEILING_S = 60.0
"""A ``Retry-After`` longer than this is not waited for: the model is told instead."""


class NotExecuted(ToolfleetError):
    """Raised by a tool that knows its upstream refused the request: nothing took effect.

    ``raise NotExecuted("card declined")`` for a validation, permission or business-rule
    refusal (``retryable=False``, the default: the model is told and nothing is retried), or
    ``NotExecuted("upstream busy", retryable=True)`` when trying again can help (a replay-safe
    tool is then retried by the fleet with the same idempotency key). Raise it only when the
    upstream's answer proves nothing was applied; when in doubt let the exception through: an
    unknown effect is probed, a false "not executed" can run an effect twice.
    """

    def __init__(
        self, reason: str, *, retryable: bool = False, retry_after_s: float | None = None
    ) -> None:
        super().__init__(reason)
        self.reason = reason
        self.retryable = retryable
        self.retry_after_s = retry_after_s


@dataclass(frozen=True)
class EffectVerdict:
    """What one failure signal proves: the effect, whether a retry can help, and why.

    A tool's ``classify`` hook returns one of these (or None to use the standard table); build
    it with ``EffectVerdict.not_executed(...)``, ``.unknown(...)`` or ``.wrong_effect(...)``.
    """

    effect: Effect
    reason: str
    retry: RetryHint | None = None
    """For not_executed: transient (trying again can help) or permanent; None otherwise."""
    retry_after_s: float | None = None
    """The upstream's Retry-After, when it gave one."""
    throttled: bool = False
    """The upstream refused for its rate limit (HTTP 429): the tool's rate buckets slow down."""

    @classmethod
    def not_executed(
        cls,
        reason: str,
        *,
        retryable: bool = False,
        retry_after_s: float | None = None,
        throttled: bool = False,
    ) -> EffectVerdict:
        """The request provably took no effect upstream."""
        return cls("not_executed", reason, "transient" if retryable else "permanent",
                   retry_after_s, throttled)  # fmt: skip

    @classmethod
    def unknown(cls, reason: str) -> EffectVerdict:
        """The effect may or may not have happened: probe before anything else."""
        return cls("unknown", reason)

    @classmethod
    def wrong_effect(cls, reason: str) -> EffectVerdict:
        """Something took effect upstream, but not what the call asked for: compensate."""
        return cls("wrong_effect", reason)


ClassifyHook = Callable[[BaseException], "EffectVerdict | None"]
"""A tool's own mapping of its exceptions: a verdict, or None for the standard table."""


# --- the classification table ---------------------------------------------------------------

_NEVER_LEFT: frozenset[tuple[str, str]] = frozenset(
    {
        ("httpx", "ConnectError"),
        ("httpx", "ConnectTimeout"),
        ("httpcore", "ConnectError"),
        ("httpcore", "ConnectTimeout"),
        ("aiohttp", "ClientConnectorError"),
        ("requests", "ConnectTimeout"),
        ("urllib3", "NewConnectionError"),
        ("urllib3", "NameResolutionError"),
        ("urllib3", "ConnectTimeoutError"),
    }
)
"""Library errors raised before a request left the client (by module root and class name)."""

_WRAPPERS: frozenset[tuple[str, str]] = frozenset(
    {("requests", "ConnectionError"), ("urllib3", "MaxRetryError")}
)
"""Library errors that only wrap the real signal (their cause or ``reason`` tells)."""

_HTTP_STATUS_ERRORS: frozenset[tuple[str, str]] = frozenset(
    {("httpx", "HTTPStatusError"), ("requests", "HTTPError"), ("aiohttp", "ClientResponseError")}
)
"""Library errors that carry the HTTP status the upstream answered with."""

CLASSIFICATION: tuple[tuple[str, str, str], ...] = (
    ("the body returned", "applied", "-"),
    ("NotExecuted(reason, retryable=...) raised by the tool", "not_executed",
     "as the tool says (default: no)"),
    ("a declared definite exception type, or the tool's classify hook", "as declared",
     "as declared"),
    ("connection refused, DNS failure, connect timeout (the request never left)",
     "not_executed", "yes (transient)"),
    ("HTTP 429 (Retry-After honoured)", "not_executed", "yes (transient)"),
    ("HTTP 4xx other than 408, 409, 429", "not_executed", "no (permanent)"),
    ("read/write timeout, connection reset or closed, HTTP 408/409/5xx, the fleet's timeout, "
     "a lost worker, a broker error after start, any other exception", "unknown",
     "probe first"),
    ("start-to-close timeout: the body ran past the tool's timeout and was cancelled",
     "unknown", "probe first"),
    ("heartbeat timeout: the body sent no heartbeat within the tool's heartbeat timeout and "
     "was cancelled while running", "unknown", "probe first"),
    ("schedule-to-start timeout: not started within the tool's schedule-to-start timeout "
     "(never started)", "not_executed", "no (permanent)"),
    ("a probe, a guardrail or an operator finds the effect wrong", "wrong_effect",
     "compensate"),
)  # fmt: skip
"""(failure signal, effect for a tool that is not read_only, would trying again help): the
table docs/concepts/effects.md and ``toolfleet tools describe`` print. Every row but the
schedule-to-start one is a failure after ``started``; the exception rows are in the order
``classify_exception`` applies them, the timeout rows are ``timeout_verdict``'s."""

TimeoutKind = Literal["schedule_to_start", "start_to_close", "heartbeat"]
"""Temporal's kinds of per-tool timeout (schedule-to-close is the turn's deadline)."""


def timeout_verdict(kind: TimeoutKind) -> EffectVerdict:
    """What a call that ran out of ``kind`` of time proves (see CLASSIFICATION): one that was
    never started took no effect and is not tried again (the model is told); one cancelled
    while its body ran may have applied anything (``effect_for_class`` then makes a read_only
    tool's not_executed)."""
    if kind == "schedule_to_start":
        return EffectVerdict.not_executed("not started within its schedule-to-start timeout")
    if kind == "heartbeat":
        return EffectVerdict.unknown("no heartbeat within its heartbeat timeout while running")
    return EffectVerdict.unknown("ran past its start-to-close timeout")


def classify_exception(
    exc: BaseException,
    *,
    definite: Sequence[type[BaseException]] = (),
    hook: ClassifyHook | None = None,
    now: float = 0.0,
) -> EffectVerdict:
    """What an exception raised after ``started`` proves about the effect (see CLASSIFICATION).

    Order: ``NotExecuted``; the tool's ``hook``; its ``definite`` exception types (a definite
    failure: not executed, permanent); the standard table. A hook that raises is ignored (the
    table decides). ``now`` (Unix time) reads an HTTP-date ``Retry-After``.
    """
    if isinstance(exc, NotExecuted):
        return EffectVerdict.not_executed(
            exc.reason, retryable=exc.retryable, retry_after_s=exc.retry_after_s
        )
    if hook is not None:
        try:
            verdict = hook(exc)
        except Exception:  # a broken hook must not hide the failure it was asked about
            verdict = None
        if verdict is not None:
            return verdict
    if definite and isinstance(exc, tuple(definite)):
        return EffectVerdict.not_executed(f"{_name(exc)} is declared a definite failure")
    return _standard(exc, now, depth=0)


def _standard(exc: BaseException, now: float, depth: int) -> EffectVerdict:
    name = _name(exc)
    if isinstance(exc, asyncio.CancelledError):
        return EffectVerdict.unknown("the call was cancelled while it ran")
    if isinstance(exc, ConnectionRefusedError | socket.gaierror) or _named(exc, _NEVER_LEFT):
        return EffectVerdict.not_executed(
            f"{name}: the request never left (connection refused, DNS failure or connect timeout)",
            retryable=True,
        )
    if _named(exc, _HTTP_STATUS_ERRORS):
        status, headers = _http_status(exc)
        if status is not None:
            return _by_status(status, headers, now)
    if depth < 4 and _named(exc, _WRAPPERS):
        for inner in _causes(exc):
            verdict = _standard(inner, now, depth + 1)
            if verdict.effect == "not_executed":
                return verdict
    return EffectVerdict.unknown(f"{name} after the call started: it may have taken effect")


def _by_status(status: int, headers: Any, now: float) -> EffectVerdict:
    if status == 429:
        retry_after = parse_retry_after(_header(headers, "retry-after"), now)
        return EffectVerdict.not_executed(
            "HTTP 429: the upstream refused the request for now", retryable=True,
            retry_after_s=retry_after, throttled=True,
        )  # fmt: skip
    if 400 <= status < 500 and status not in (408, 409):
        return EffectVerdict.not_executed(f"HTTP {status}: the upstream refused the request")
    if 200 <= status < 400:
        return EffectVerdict.unknown(f"HTTP {status} raised as an error: it may have applied")
    return EffectVerdict.unknown(f"HTTP {status}: the upstream may have applied the request")


def parse_retry_after(value: str | None, now: float) -> float | None:
    """Seconds to wait from a ``Retry-After`` header (delay-seconds or an HTTP-date)."""
    if value is None or not value.strip():
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - now)


def _name(exc: BaseException) -> str:
    return type(exc).__name__


def _named(exc: BaseException, names: frozenset[tuple[str, str]]) -> bool:
    """Whether ``exc``'s class, or a base of it, is one of ``names`` (module root, class)."""
    return any(
        (cls.__module__.partition(".")[0], cls.__name__) in names for cls in type(exc).__mro__
    )


def _causes(exc: BaseException) -> Iterator[BaseException]:
    for inner in (exc.__cause__, getattr(exc, "reason", None), *exc.args):
        if isinstance(inner, BaseException) and inner is not exc:
            yield inner


def _http_status(exc: BaseException) -> tuple[int | None, Any]:
    response = getattr(exc, "response", None)
    code = getattr(response, "status_code", None)
    if isinstance(code, int):
        return code, getattr(response, "headers", None)
    status = getattr(exc, "status", None)  # aiohttp
    if isinstance(status, int):
        return status, getattr(exc, "headers", None)
    return None, None


def _header(headers: Any, name: str) -> str | None:
    if headers is None:
        return None
    try:
        value = headers.get(name) or headers.get(name.title())
    except AttributeError:
        return None
    return value if isinstance(value, str) else None


# --- rules built on the verdict ---------------------------------------------------------------


def effect_for_class(effect_class: str, effect: Effect) -> Effect:
    """A read-only tool cannot have applied anything: its unknown effect is not_executed."""
    if effect == "unknown" and effect_class == "read_only":
        return "not_executed"
    return effect


def fleet_retries(
    effect: Effect,
    retry: RetryHint | None,
    effect_class: str,
    *,
    attempt: int,
    max_attempts: int,
    retry_after_s: float | None = None,
) -> bool:
    """Whether the fleet runs a not-executed call again (same idempotency key) instead of
    reporting it: transient, replay-safe, attempts left, and no Retry-After too long to wait."""
    if retry_after_s is not None and retry_after_s > RETRYABLE_STATUS_CEILING_S:
        return False
    return (
        effect == "not_executed"
        and retry == "transient"
        and effect_class in REPLAY_SAFE
        and attempt < max_attempts
    )


def retry_delay(
    attempt: int, retry_after_s: float | None, *, base_s: float, cap_s: float, jitter: float
) -> float:
    """Seconds before attempt ``attempt + 1``: Retry-After when given, else the one backoff
    policy (``kernel.rules.backoff``: half the step fixed, ``jitter`` in [0, 1) of the other
    half)."""
    if retry_after_s is not None:
        return retry_after_s
    return Backoff.capped(base_s, cap_s).delay(attempt, jitter)


class _Severe(Protocol):
    """The field of a CallError the turn rules read."""

    @property
    def severity(self) -> str: ...


class _Settling(Protocol):
    """The fields of a CallOutcome the turn rules read."""

    @property
    def status(self) -> str: ...
    @property
    def effect(self) -> str: ...
    @property
    def resolved(self) -> bool: ...
    @property
    def fails_turn(self) -> bool: ...
    @property
    def error(self) -> _Severe | None: ...


def settles_call(outcome: _Settling, on_unknown: str) -> bool:
    """Whether an outcome gives the model its answer for the call now.

    A resolved outcome does; an unknown or wrong effect does only under ``report_now``
    (reconciled in the background); a not-executed outcome waiting for the fleet's retry
    never does: the model sees only the final attempt.
    """
    return outcome.resolved or (
        on_unknown == "report_now" and outcome.effect in ("unknown", "wrong_effect")
    )


def parent_cancellation(outcome: _Settling, run_cancelled: bool) -> bool:
    """Whether an outcome is its run's cancellation rather than a failure of the call: the run
    was cancelled (a cancel request without a call id) and the call ended ``cancelled`` with a
    cancellation's severity. Such an outcome is never output and never fails the turn
    (lifecycle item 12); a call that raised something else meanwhile still failed."""
    if not run_cancelled or outcome.status != "cancelled":
        return False
    return outcome.error is None or outcome.error.severity == "cancellation"


def fails_turn(outcome: _Settling, failure_policy: str, *, run_cancelled: bool = False) -> bool:
    """Whether a settled outcome fails its turn: flagged by the executor (no failure handler,
    tripwires, BaseExceptions), or a definite failure under ``failure_policy="fail_turn"``.
    Timeouts, unknown effects and cancellations fail a turn only when flagged, and a parent
    cancellation never does (``parent_cancellation``; ``run_cancelled``: the run was
    cancelled). The aggregator and the planner's concurrency gate both ask this."""
    if parent_cancellation(outcome, run_cancelled):
        return False
    return outcome.fails_turn or (
        failure_policy == "fail_turn" and outcome.status == "failed" and outcome.resolved
    )


def counts_against_circuit(status: str) -> bool:
    """Whether an executed call's status counts as a failure in its tool version's window."""
    return status in ("failed", "timed_out")


_PROBE_EFFECTS: dict[str, Effect] = {
    "applied": "applied",
    "not_applied": "not_executed",
    "wrong_effect": "wrong_effect",
    "unknown": "unknown",
}


def effect_of_probe(answer: ProbeAnswer) -> Effect:
    """The effect a probe's answer establishes (carried on the probe's outcome)."""
    return _PROBE_EFFECTS[answer]


def probe_answer(effect: str) -> ProbeAnswer:
    """The probe answer a probe outcome's effect carries (the inverse of ``effect_of_probe``)."""
    for answer, carried in _PROBE_EFFECTS.items():
        if carried == effect:
            return answer  # type: ignore[return-value]
    return "unknown"


# --- the release gate ----------------------------------------------------------------------


def gated_by_default(
    effect_class: str, has_probe: bool, *, unattended_reason: str | None, effect_declared: bool
) -> bool:
    """Whether a tool needs a human's approval for every call unless it says otherwise.

    Only actions whose failures can be recognised, whose state can be queried and whose
    consequences can be compensated run unattended: an ``irreversible`` tool always asks; a
    ``non_idempotent`` one asks when it declares no probe. An explicit opt-out
    (``unattended_reason``) runs a non_idempotent one unattended. A tool served unchanged from
    the Agents SDK whose effect class nobody declared keeps the SDK's behaviour
    (``effect_declared=False``).
    """
    if not effect_declared:
        return False
    if effect_class == "irreversible":
        return True  # whatever it declares: only an explicit needs_approval=False opts out
    return effect_class in GATED and not has_probe and unattended_reason is None


def runs_unattended_without_probe(effect_class: str, has_probe: bool, approval: str) -> bool:
    """A side-effecting tool that no human confirms and whose state nobody can query."""
    return effect_class in GATED and not has_probe and approval == "never"


# --- the effect class of a tool an MCP server describes --------------------------------------

MCP_EFFECT_HINTS: tuple[str, ...] = (
    "readOnlyHint",
    "destructiveHint",
    "idempotentHint",
    "openWorldHint",
)
"""The MCP tool annotations that say something about a tool's effect (their wire names)."""


@dataclass(frozen=True)
class SeededEffect:
    """The effect class a worker gives a tool it serves from an MCP server, and why."""

    effect_class: EffectClass
    source: Literal["declared", "default", "annotations", "unannotated"]
    """Who said so: the operator for this tool (``effects=``), the operator for every tool it
    did not name (``default_effect=``), the server's annotations, or nobody."""
    reason: str
    """The words ``toolfleet`` logs when the worker starts."""


def mcp_effect_class(
    annotations: Mapping[str, Any] | None,
    *,
    declared: EffectClass | None = None,
    default: EffectClass | None = None,
) -> SeededEffect:
    """The effect class of a tool an MCP server lists, from what the operator declared and,
    failing that, from the server's annotations (``annotations``: their wire form, camelCase).

    What the operator declares wins: ``declared`` (this tool), then ``default`` (every tool
    it did not name). Otherwise the annotations seed it, and only a hint that is exactly
    ``true`` counts (the specification's defaults are not assumed, so a hint left out never
    makes a tool look safer or riskier than the server said):

    - ``readOnlyHint``: read_only, unless the server also calls the tool destructive (two
      hints that contradict each other: the cautious one is taken);
    - ``idempotentHint``: idempotent, unless the server also calls it destructive or
      open-world (the cautious reading: its repeat may reach what the server does not
      control);
    - anything else, no effect hint at all included: non_idempotent. A tool that may have
      applied something is then never run again blindly: an unknown effect is probed or goes
      to a person, and without a probe every call waits for approval (the release gate).
    """
    if declared is not None:
        return SeededEffect(declared, "declared", f"declared {declared} (effects=)")
    if default is not None:
        return SeededEffect(default, "default", f"declared {default} (default_effect=)")
    given = {h: v for h in MCP_EFFECT_HINTS if isinstance(v := (annotations or {}).get(h), bool)}
    said = {hint for hint, value in given.items() if value}
    if not given:
        return SeededEffect(
            "non_idempotent",
            "unannotated",
            "the server says nothing about its effect: non_idempotent",
        )
    if "readOnlyHint" in said:
        if "destructiveHint" in said:
            return SeededEffect(
                "non_idempotent",
                "annotations",
                "readOnlyHint and destructiveHint contradict each other: non_idempotent",
            )
        return SeededEffect("read_only", "annotations", "readOnlyHint: read_only")
    if "idempotentHint" in said:
        risky = sorted(said & {"destructiveHint", "openWorldHint"})
        if risky:
            return SeededEffect(
                "non_idempotent",
                "annotations",
                f"idempotentHint with {' and '.join(risky)}: non_idempotent",
            )
        return SeededEffect("idempotent", "annotations", "idempotentHint: idempotent")
    hints = " and ".join(sorted(said)) or "no hint that makes it safe"
    return SeededEffect("non_idempotent", "annotations", f"{hints}: non_idempotent")


def retries_blindly(effect_class: str, client_retries: int) -> bool:
    """Whether a client that retries every failed call by itself (the Agents SDK's MCP server
    with ``max_retry_attempts``: any exception, timeouts included; -1 without end) would run
    a tool of ``effect_class`` again without knowing whether its first try took effect. Only
    replay-safe tools may be served through such a client: the fleet retries those itself."""
    return client_retries != 0 and effect_class not in REPLAY_SAFE


# --- the review material: what happens next, per tool ----------------------------------------


@dataclass(frozen=True)
class Budgets:
    """The recovery budgets the rows quote (from the deployment's settings)."""

    max_attempts: int
    probe_budget: int
    circuit_error_rate: float
    circuit_window_s: float


@dataclass(frozen=True)
class ReviewRow:
    """One failure signal of one tool: what is observed and what follows."""

    signal: str
    effect: str
    may_have_applied: str
    first_action: str
    forbidden: str
    human: str


class _Reviewed(Protocol):
    """The fields of a ToolSpec the review reads."""

    @property
    def effect_class(self) -> str: ...
    @property
    def has_probe(self) -> bool: ...
    @property
    def has_compensate(self) -> bool: ...
    @property
    def needs_approval(self) -> str: ...
    @property
    def effect_declared(self) -> bool: ...
    @property
    def sdk_tool(self) -> bool: ...
    @property
    def unattended_reason(self) -> str | None: ...


def attendance(spec: _Reviewed) -> tuple[bool, str]:
    """(runs unattended, why): the release gate's verdict on a published tool, in words."""
    if spec.needs_approval == "always":
        return False, "a human approves every call"
    if spec.needs_approval == "callable":
        return False, "its approval policy decides per call"
    if spec.effect_class not in GATED:
        return True, f"{spec.effect_class}: replay-safe"
    if spec.has_probe:
        return True, "its probe can establish any unknown effect"
    if spec.unattended_reason:
        return True, f"opted out of the release gate: {spec.unattended_reason}"
    if not spec.effect_declared:
        return True, (
            "served unchanged from the Agents SDK with no declared effect class (the SDK's "
            "behaviour); declare effect= and a probe, or approval, to put it under the gate"
        )
    return True, "needs_approval=False declared, without a probe and without a reason"


def needs_review(spec: _Reviewed) -> bool:
    """A tool that runs unattended without a probe and without a recorded reason."""
    return (
        runs_unattended_without_probe(spec.effect_class, spec.has_probe, spec.needs_approval)
        and not spec.unattended_reason
    )


def review_rows(spec: _Reviewed, budgets: Budgets) -> list[ReviewRow]:
    """The failure table of one tool: every CLASSIFICATION row and the systemic one, with the
    first action, the forbidden one and where a human takes over."""
    rows = []
    for signal, listed, _retry in CLASSIFICATION:
        if listed == "as declared":
            rows.append(ReviewRow(signal, listed, "as declared", "as for the declared effect",
                                  "-", "as for the declared effect"))  # fmt: skip
            continue
        effect = effect_for_class(spec.effect_class, listed)  # type: ignore[arg-type]
        row = _row(spec, budgets, signal, effect, transient="transient" in _retry)
        if "as the tool says" in _retry:
            row = dataclasses.replace(
                row, first_action=row.first_action + " (retryable=True: as a transient failure)"
            )
        rows.append(row)
    rows.append(
        ReviewRow(
            f"error rate >= {budgets.circuit_error_rate:.0%} of one version over "
            f"{budgets.circuit_window_s:g} s",
            "-",
            "-",
            "open the version's circuit, route new calls to an earlier healthy version, "
            "reconcile what ran",
            "rolling back without reconciling effects",
            "the circuit's task lists the calls to reconcile",
        )
    )
    return rows


def _row(spec: _Reviewed, budgets: Budgets, signal: str, effect: str, transient: bool) -> ReviewRow:
    if effect == "applied":
        return ReviewRow(signal, effect, "yes", "reported to the model", "-", "never")
    if effect == "not_executed":
        if transient and spec.effect_class in REPLAY_SAFE:
            action = (
                f"retried with the same idempotency key, backoff with jitter or Retry-After, "
                f"up to {budgets.max_attempts} attempts; the model sees the last"
            )
        elif transient:
            action = "reported to the model; not retried by the fleet (not replay-safe)"
        else:
            action = "reported to the model; never retried"
        return ReviewRow(signal, effect, "no", action, "unbounded retry loops", "never")
    if effect == "wrong_effect":
        if spec.has_compensate:
            action, human = (
                "compensate after approval, linked in the audit chain",
                ("approval of the compensation"),
            )
        else:
            action, human = "no compensate action declared", "at once"
        return ReviewRow(signal, effect, "yes", action + "; the run's later side-effecting "
                         "calls wait for a human", "deleting history", human)  # fmt: skip
    if spec.has_probe:
        action = (
            f"probe by idempotency key (up to {budgets.probe_budget} probes): applied -> "
            "resolved with the probe's output; not applied -> as not executed"
        )
        human = "probe budget spent, or not applied and not replay-safe"
    elif spec.effect_class == "idempotent":
        action = "re-submitted with the same idempotency key (its upstream dedupes)"
        human = f"still unknown after {budgets.max_attempts} attempts"
    else:
        action, human = "no probe declared: a human task", "at once"
    return ReviewRow(signal, effect, "maybe", action, "re-submitting blindly", human)
