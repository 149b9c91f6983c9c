"""What every wire message shares: the schema version, the tenant, strict decoding."""

from __future__ import annotations

from typing import Any, ClassVar, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from schemas._errors import InvalidMessageError

SCHEMA_VERSION: Literal[1] = 1
"""The only schema version this release reads and writes."""


class WireModel(BaseModel):
    """Base of every model on the wire: unknown fields are errors, instances are immutable."""

    model_config = ConfigDict(
        extra="forbid",
        frozen=True,
        ser_json_bytes="base64",
        val_json_bytes="base64",
    )


class Message(WireModel):
    """A top-level message on a topic: versioned and owned by a tenant."""

    topic: ClassVar[str] = ""

    schema_version: Literal[1] = Field(
        default=SCHEMA_VERSION, description="Version of this message's schema."
    )
    tenant_id: str = Field(min_length=1, description="The tenant that owns this message.")

    @field_validator("schema_version", mode="before")
    @classmethod
    def _known_version(cls, value: Any) -> Any:
        # type() and not ==: True == 1 and 1.0 == 1 in Python, and neither is a version.
        if type(value) is not int or value != SCHEMA_VERSION:
            raise ValueError(
                f"unsupported schema_version {value!r}; this release reads version "
                f"{SCHEMA_VERSION}: re-publish the message as version {SCHEMA_VERSION} "
                "or upgrade the service"
            )
        return value

    @classmethod
    def decode(cls, raw: bytes | str) -> Self:
        """Parse a message from JSON bytes, raising InvalidMessageError with a readable reason.

        Strict: nothing on the wire is coerced (``"7"``, ``7.0`` or ``true`` is not an int,
        ``"yes"`` is not a bool).
        """
        try:
            return cls.model_validate_json(raw, strict=True)
        except ValidationError as exc:
            reason = describe_validation_error(exc)
            raise InvalidMessageError(
                f"invalid {cls.__name__}: {reason}", reason=f"invalid {cls.__name__}: {reason}"
            ) from None

    def encode(self) -> bytes:
        """Serialise to compact JSON bytes, as written to Kafka."""
        return self.model_dump_json(exclude_none=True).encode()


def describe_validation_error(exc: ValidationError) -> str:
    """One line per problem: the dotted path of the field, then why it is wrong."""
    parts = []
    for error in exc.errors(include_url=False):
        loc = ".".join(str(p) for p in error["loc"]) or "<message>"
        msg = error["msg"]
        if error["type"] == "json_invalid":
            loc, msg = "<message>", f"not valid JSON ({error.get('ctx', {}).get('error', msg)})"
        parts.append(f"{loc}: {msg}")
    return "; ".join(parts)
