"""Size limits on what enters a message, so that nothing toolfleet produces is too big to send.

Kafka refuses a record over its limit (the broker's ``message.max.bytes``, the producer's
``max_request_size``: 1 MiB by default), and a record that can never fit must never be retried
as if the broker were away. Text that toolfleet copies into its messages (exception messages,
validation errors, tool outputs, dead-lettered bytes) is cut to a bound first; the settings
that set the bounds live in ``kernel.settings``.
"""

from __future__ import annotations

import hashlib

# One home for cutting text: the wire models cut their error messages with it.
from schemas.internal import cut_text

__all__ = ["cut_text", "digest", "json_depth_exceeds"]


def digest(raw: bytes) -> str:
    """sha256 of ``raw``, hex: names bytes that were cut or moved elsewhere."""
    return hashlib.sha256(raw).hexdigest()


def json_depth_exceeds(raw: str | bytes, limit: int) -> bool:
    """Whether JSON text nests arrays/objects deeper than ``limit`` (strings are skipped).

    A linear scan, so that hostile input is refused before any recursive parser meets it.
    """
    text = raw.decode(errors="replace") if isinstance(raw, bytes) else raw
    if text.count("[") + text.count("{") <= limit:  # the usual case, at C speed
        return False
    depth, in_string, escaped = 0, False, False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            if depth > limit:
                return True
        elif char in "]}":
            depth -= 1
    return False
