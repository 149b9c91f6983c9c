"""Pure decisions: no I/O library is imported here (a ``make lint`` contract keeps it so).

- ``effects``: what counts as having happened, and what recovery may do about it;
- ``approvals``: the arguments an approval policy may judge (fail closed otherwise);
- ``backoff``: the one backoff policy (capped exponential steps, equal jitter);
- ``limits``: size and depth bounds of messages, outputs and dead letters;
- ``versions``: tool version order and which version a call goes to;
- ``texts``: the model-visible texts;
- ``outcomes``: outcomes toolfleet writes on a call's behalf (lost, identity mismatch);
- ``auth``: signing and verifying decisions (approvals, cancellations, task resolutions);
- ``mcp``: what the MCP front door tells a client (tools, annotations, call results);
- ``progress``: which progress events a reader shows (each once, a retry's told apart).
"""

__all__ = [
    "approvals",
    "auth",
    "backoff",
    "effects",
    "limits",
    "mcp",
    "outcomes",
    "progress",
    "texts",
    "versions",
]
