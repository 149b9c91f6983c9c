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
  worker stores in the call's ledger entry, for the console's call view.

The call's argument values never appear in either: every string value of the arguments (3
characters or more) is replaced by ``<argument>`` in the message and the traceback (a tool
that raises ``ValueError(f"no city {city}")`` is logged as ``no city <argument>``). Numbers
are left alone: they would also rub out the traceback's line numbers.
"""

from __future__ import annotations

import asyncio
import logging
import time
import traceback
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from kernel.rules.effects import NotExecuted
from kernel.tools._capture import text_of

TRACEBACK_MAX_BYTES = 8_192
"""The longest traceback kept with a call (its head and its tail, the middle cut)."""
MESSAGE_MAX_BYTES = 2_048
"""The longest exception message kept with a call."""
TRACEBACKS_PER_TOOL = 10
"""Tracebacks logged per tool per window; the rest are counted in one summary line."""
WINDOW_S = 60.0

REDACTED = "<argument>"
_SHORTEST_REDACTED = 3

log = logging.getLogger("kernel.tools")


@dataclass(frozen=True)
class ToolFailure:
    """What user code raised during a call: class name, message and traceback, bounded and
    with the call's argument values taken out."""

    type: str
    message: str
    traceback: str

    @classmethod
    def of(cls, exc: BaseException, arguments: Mapping[str, Any] | None = None) -> ToolFailure:
        """The failure record of ``exc`` (raised by a call whose parsed arguments are
        ``arguments``, when they parsed)."""
        values = argument_values(arguments)
        text = "".join(traceback.format_exception(exc))
        message = redact(text_of(exc), values)
        return cls(
            type=type(exc).__name__,
            message=_cut(message, MESSAGE_MAX_BYTES),
            traceback=_cut(redact(text, values), TRACEBACK_MAX_BYTES),
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


def _cut(text: str, limit: int) -> str:
    """``text`` within ``limit`` bytes: its head and its tail (a traceback's outer frames and
    the innermost frames with the exception), what was cut said in between."""
    raw = text.encode()
    if len(raw) <= limit:
        return text
    marker = f"\n[... {len(raw) - limit} bytes cut ...]\n".encode()
    head = (limit - len(marker)) // 4
    tail = limit - len(marker) - head
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
        self, tool: str, failure: ToolFailure, exc: BaseException, *, part: str = "tool"
    ) -> None:
        """One call of ``tool`` failed with ``exc`` (described by ``failure``) in ``part``
        of its code (the tool, its probe, its compensate action)."""
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
            extra={"tool": tool, "error_type": failure.type, "part": part},
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


TOOL_FAILURES = FailureLog()
"""This process's log of tools' failures."""
