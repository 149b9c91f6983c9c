"""A tool's exception as an operator sees it: one log line per call with its traceback, and a
record kept with the call.

Before, a tool that raised on 59 calls left no line anywhere: the exception became the call's
outcome (what the model sees, and ``error.type`` / ``error.message``) and its traceback was
lost. Now each failure of user code (the tool body, a guardrail, a hook, an approval policy, a
failure formatter) is:

- logged once, at ERROR (WARNING for ``NotExecuted``, the tool's own "upstream refused"), with
  its traceback; at most ``TRACEBACKS_PER_TOOL`` per tool per ``WINDOW_S``, then one line with
  how many more there were (a tool failing on every call must not flood the log);
- kept as a ``ToolFailure`` (type, message, traceback cut to ``TRACEBACK_MAX_BYTES``) that the
  worker stores with the call's attempt in its ledger entry, for the console's call view; the
  log line names the call in full (tenant, run, call, attempt) and links to that view.

The call's argument values never appear in either: every string value of the arguments (3
characters or more) is replaced by ``<argument>`` in the message and the traceback (a tool
that raises ``ValueError(f"no city {city}")`` is logged as ``no city <argument>``). Numbers
are left alone: they would also rub out the traceback's line numbers. Secrets are taken out
too, by a pattern (``Settings.traceback_redact_pattern``; ``FailureRecording``): what it
matches becomes ``<redacted>`` (``password=<redacted>``, ``Authorization: Bearer <redacted>``).
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
import traceback
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

from kernel.rules.effects import NotExecuted
from kernel.settings import TRACEBACK_REDACT_PATTERN, Settings
from kernel.tools._capture import text_of
from schemas import ExecutionCommand

TRACEBACK_MAX_BYTES = 16_384
"""The longest traceback kept with a call's attempt (its head and its tail, the middle cut)."""
MESSAGE_MAX_BYTES = 2_048
"""The longest exception message kept with a call."""
TRACEBACKS_PER_TOOL = 10
"""Tracebacks logged per tool per window; the rest are counted in one summary line."""
WINDOW_S = 60.0

REDACTED = "<argument>"
SECRET = "<redacted>"
"""What a secret (``traceback_redact_pattern``'s match) becomes."""
_SHORTEST_REDACTED = 3
_REDACTED_FIRST = 4
"""A text is cut to this many times its limit before its secrets are looked for (whole lines
kept: a secret is never split), so a huge one costs the pattern a bounded scan."""

SECRETS = re.compile(TRACEBACK_REDACT_PATTERN)
"""The default secrets pattern (``Settings.traceback_redact_pattern``'s default)."""


@dataclass(frozen=True)
class FailureRecording:
    """How a process keeps what user code raised: the secrets taken out of each record, and
    the console whose call view its log lines link to."""

    secrets: re.Pattern[str] = SECRETS
    console_url: str | None = None
    """The console's public URL (``console_public_url``): a log line's link is absolute."""

    @classmethod
    def of(cls, settings: Settings) -> FailureRecording:
        """As ``settings`` say (``traceback_redact_pattern``, ``console_public_url``)."""
        pattern = settings.traceback_redact_pattern or TRACEBACK_REDACT_PATTERN
        return cls(re.compile(pattern), settings.console_public_url)

    def failure(
        self, exc: BaseException, arguments: Mapping[str, Any] | None = None
    ) -> ToolFailure:
        """The record of ``exc``, argument values and secrets taken out (``ToolFailure.of``)."""
        return ToolFailure.of(exc, arguments, secrets=self.secrets)

    def link(self, command: ExecutionCommand, *, attempt: bool = True) -> str:
        """Where the console shows the call of ``command``: at its attempt's failure, unless
        ``attempt`` is False (a probe's or compensation's, kept with no attempt)."""
        path = call_view_path(
            command.tenant_id, command.run_id, command.call_id, command.attempt if attempt else None
        )
        return f"{self.console_url.rstrip('/')}{path}" if self.console_url else path


def call_view_path(tenant_id: str, run_id: str, call_id: str, attempt: int | None = None) -> str:
    """The console's page of a call (``/calls/TENANT/CALL?run=RUN``), at one attempt's failure
    (``#attempt-N``) when ``attempt`` is given."""
    tenant, call, run = (quote(part, safe="") for part in (tenant_id, call_id, run_id))
    path = f"/calls/{tenant}/{call}?run={run}"
    return f"{path}#attempt-{attempt}" if attempt is not None else path


log = logging.getLogger("kernel.tools")


@dataclass(frozen=True)
class ToolFailure:
    """What user code raised during a call: class name, message and traceback, bounded and
    with the call's argument values taken out."""

    type: str
    message: str
    traceback: str

    @classmethod
    def of(
        cls,
        exc: BaseException,
        arguments: Mapping[str, Any] | None = None,
        *,
        secrets: re.Pattern[str] = SECRETS,
    ) -> ToolFailure:
        """The failure record of ``exc`` (raised by a call whose parsed arguments are
        ``arguments``, when they parsed), argument values and what ``secrets`` matches
        taken out, then cut to size."""
        values = argument_values(arguments)

        def clean(text: str, limit: int) -> str:
            text = _cut(text, limit * _REDACTED_FIRST)
            return _cut(redact_secrets(redact(text, values), secrets), limit)

        return cls(
            type=type(exc).__name__,
            message=clean(text_of(exc), MESSAGE_MAX_BYTES),
            traceback=clean("".join(traceback.format_exception(exc)), TRACEBACK_MAX_BYTES),
        )


def argument_values(arguments: Mapping[str, Any] | None) -> list[str]:
    """Every string value in ``arguments`` (nested ones too), longest first."""
    found: set[str] = set()

    def walk(value: Any) -> Iterator[str]:
        if isinstance(value, str):
            yield value
        elif isinstance(value, Mapping):
            for item in value.values():
                yield from walk(item)
        elif isinstance(value, list | tuple | set | frozenset):
            for item in value:
                yield from walk(item)

    for value in walk(dict(arguments or {})):
        if len(value) >= _SHORTEST_REDACTED:
            found.add(value)
    return sorted(found, key=len, reverse=True)


def redact(text: str, values: list[str]) -> str:
    """``text`` with each of ``values`` (and its repr, quotes escaped) replaced."""
    for value in values:
        text = text.replace(value, REDACTED)
        escaped = repr(value)[1:-1]
        if escaped != value:
            text = text.replace(escaped, REDACTED)
    return text


def redact_secrets(text: str, secrets: re.Pattern[str]) -> str:
    """``text`` with what ``secrets`` matches replaced by ``<redacted>``: the text of the
    pattern's groups that took part in a match (``password=<redacted>``: the key stays), or
    the whole match when none did."""

    def replace(match: re.Match[str]) -> str:
        begin = match.start()
        spans = sorted(
            match.span(group) for group in range(1, secrets.groups + 1) if match.start(group) >= 0
        )
        if not spans:
            return SECRET
        kept, at = [], begin
        for start, end in spans:
            if start < at:
                continue  # a group inside one already replaced
            kept += [match.string[at:start], SECRET]
            at = end
        kept.append(match.string[at : match.end()])
        return "".join(kept)

    return secrets.sub(replace, text)


def _cut(text: str, limit: int) -> str:
    """``text`` within ``limit`` bytes: its head and its tail (a traceback's outer frames and
    the innermost frames with the exception), what was cut said in between. The cut falls
    between lines where the head and the tail have one, so no line is kept in part."""
    raw = text.encode()
    if len(raw) <= limit:
        return text
    marker_max = len(f"\n[... {len(raw)} bytes cut ...]\n".encode())
    head = (limit - marker_max) // 4
    tail = limit - marker_max - head
    line_end = raw.rfind(b"\n", 0, head)
    if line_end > 0:
        head = line_end + 1
    line_start = raw.find(b"\n", len(raw) - tail)
    if 0 <= line_start < len(raw) - 1:
        tail = len(raw) - line_start - 1
    marker = f"[... {len(raw) - head - tail} bytes cut ...]\n".encode()
    if not raw[:head].endswith(b"\n"):
        marker = b"\n" + marker
    kept = raw[:head] + marker + raw[len(raw) - tail :]
    return kept.decode(errors="ignore")


@dataclass
class _Window:
    began: float
    logged: int = 0
    unlogged: int = 0
    types: dict[str, int] = field(default_factory=dict)


class FailureLog:
    """Logs tools' failures, at most ``limit`` tracebacks per tool per ``window_s``; the
    failures beyond are counted and said in one line when the window ends."""

    def __init__(
        self,
        logger: logging.Logger = log,
        *,
        limit: int = TRACEBACKS_PER_TOOL,
        window_s: float = WINDOW_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.logger = logger
        self.limit = limit
        self.window_s = window_s
        self.clock = clock
        self._windows: dict[str, _Window] = {}

    def report(
        self,
        tool: str,
        failure: ToolFailure,
        exc: BaseException,
        *,
        part: str = "tool",
        command: ExecutionCommand | None = None,
        link: str | None = None,
    ) -> None:
        """One call of ``tool`` failed with ``exc`` (described by ``failure``) in ``part``
        of its code (the tool, its probe, its compensate action). With ``command`` the line
        names the call in full (``tenant_id``, ``run_id``, ``call_id``, ``attempt``) and
        ``call_view`` links to where the console shows it (``link``, else its path)."""
        now = self.clock()
        window = self._windows.get(tool)
        if window is None or now - window.began >= self.window_s:
            if window is not None:
                self._summarise(tool, window)
            window = self._windows[tool] = _Window(began=now)
            self._summary_at_end(tool, window)
        if window.logged >= self.limit:
            window.unlogged += 1
            window.types[failure.type] = window.types.get(failure.type, 0) + 1
            return
        window.logged += 1
        level = logging.WARNING if isinstance(exc, NotExecuted) else logging.ERROR
        if not self.logger.isEnabledFor(level):
            return
        record = self.logger.makeRecord(
            self.logger.name,
            level,
            __file__,
            0,
            "%s %s raised %s: %s",
            (part, tool, failure.type, _cut(failure.message, 300)),
            None,
            extra={
                "tool": tool,
                "error_type": failure.type,
                "part": part,
                **_naming(command, link),
            },
        )
        # The redacted traceback, not the live one (whose last line holds argument values).
        record.exc_text = failure.traceback
        self.logger.handle(record)

    def flush(self) -> None:
        """Say now what every window counted without logging (at exit, or in tests)."""
        for tool, window in list(self._windows.items()):
            self._summarise(tool, window)

    def _summary_at_end(self, tool: str, window: _Window) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # no loop: the next failure of the tool says it
        loop.call_later(self.window_s, self._summarise, tool, window)

    def _summarise(self, tool: str, window: _Window) -> None:
        if not window.unlogged:
            return
        kinds = ", ".join(f"{name} x{count}" for name, count in sorted(window.types.items()))
        self.logger.error(
            "tool %s raised %d more times within %.0f s (%s); their tracebacks were not logged "
            "but are kept with each call (toolfleet inspect, or the console's call view)",
            tool,
            window.unlogged,
            self.window_s,
            kinds,
            extra={"tool": tool, "failures_unlogged": window.unlogged},
        )
        window.unlogged = 0
        window.types.clear()


def _naming(command: ExecutionCommand | None, link: str | None) -> dict[str, object]:
    """A failure line's names for its call: its full identity and the console's link."""
    if command is None:
        return {}
    return {
        "tenant_id": command.tenant_id,
        "run_id": command.run_id,
        "call_id": command.call_id,
        "attempt": command.attempt,
        "call_view": link
        or call_view_path(command.tenant_id, command.run_id, command.call_id, command.attempt),
    }


TOOL_FAILURES = FailureLog()
"""This process's log of tools' failures."""
