"""The root of toolfleet's exception tree, and the error a message that fails its schema raises.

They live here, in the lowest layer, so the wire models can raise them without importing the
kernel; ``kernel.errors`` re-exports both and draws the whole tree.
"""

from __future__ import annotations


class ToolfleetError(Exception):
    """Root of every error toolfleet raises; the message says what to do next."""


class InvalidMessageError(ToolfleetError):
    """A message on a topic is not valid for its schema; it belongs in the dead-letter topic."""

    def __init__(self, message: str, *, reason: str) -> None:
        super().__init__(message)
        self.reason = reason
