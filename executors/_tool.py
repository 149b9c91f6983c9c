"""A tool: a Python function plus everything toolfleet must know to run it safely.

The function's parameters (after an optional leading ``ctx: ToolContext``) become a pydantic
model, validated with pydantic's default (lax) rules plus ``extra="forbid"``, as
``pydantic.validate_call`` does; its JSON schema is what the tool publishes to the registry.
The SDK silently drops unknown arguments instead; toolfleet refuses them, because a dropped
argument (say ``dry_run``) can change what a side-effecting call does.

Timeouts apply to async functions only, as in the OpenAI Agents SDK: a sync function runs in a
worker thread that cannot be interrupted, so declaring a timeout on one is a ConfigurationError
(the SDK raises ValueError there) rather than a limit that silently does not hold.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import math
import re
from collections.abc import Awaitable, Callable, Sequence
from typing import Annotated, Any, Literal, TypeVar, get_args, get_origin, get_type_hints

from pydantic import BaseModel, ConfigDict, ValidationError, create_model

from executors._context import ProbeResult, ToolContext
from executors._guardrails import InputGuardrail, OutputGuardrail
from schemas import EffectClass, ToolSpec
from toolfleet.effects import ClassifyHook, EffectVerdict, classify_exception, gated_by_default
from toolfleet.errors import ConfigurationError, ModelBehaviorError
from toolfleet.limits import cut_text
from toolfleet.texts import DEFAULT_ERROR

ToolErrorFunction = Callable[[ToolContext, Exception], str | Awaitable[str]]
"""Turns a failure into the text the model sees: ``(ctx, error) -> str``, sync or async."""

ApprovalFunction = Callable[[ToolContext, dict[str, Any]], bool | Awaitable[bool]]
"""Decides from the validated arguments whether a call needs a human's approval."""

ProbeFunction = Callable[[ToolContext], ProbeResult | Awaitable[ProbeResult]]
"""Looks the call up upstream by ``ctx.idempotency_key``."""

CompensateFunction = Callable[[ToolContext, str], str | Awaitable[str]]
"""Undoes an applied call, given the output the call returned."""

TimeoutBehavior = Literal["error_as_result", "raise_exception"]
"""What a timeout does: become the call's output (default) or fail the turn."""

OnUnknown = Literal["report_now", "reconcile_then_report"]
"""What the model is told while an effect is unknown (see the README, "What counts as happened")."""

_ProbeT = TypeVar("_ProbeT", bound=ProbeFunction)
_CompensateT = TypeVar("_CompensateT", bound=CompensateFunction)

_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # the function-name rule of the OpenAI APIs
_EFFECTS: tuple[str, ...] = get_args(EffectClass)
_TIMEOUT_BEHAVIORS: tuple[str, ...] = get_args(TimeoutBehavior)
_ON_UNKNOWN: tuple[str, ...] = get_args(OnUnknown)


def default_tool_error_function(ctx: ToolContext, error: Exception) -> str:
    """The SDK's default failure text; the exception itself is never shown to the model."""
    return DEFAULT_ERROR


class Tool:
    """A registered tool; build it with ``ToolRegistry.tool``. Calling it calls the function."""

    def __init__(
        self,
        func: Callable[..., Any],
        *,
        name: str | None = None,
        description: str | None = None,
        namespace: str | None = None,
        version: str = "1",
        effect: EffectClass = "non_idempotent",
        timeout: float | None = None,
        timeout_behavior: TimeoutBehavior = "error_as_result",
        timeout_error_function: ToolErrorFunction | None = None,
        failure_error_function: ToolErrorFunction | None = default_tool_error_function,
        needs_approval: bool | ApprovalFunction | None = None,
        input_guardrails: Sequence[InputGuardrail] = (),
        output_guardrails: Sequence[OutputGuardrail] = (),
        on_unknown: OnUnknown | None = None,
        is_enabled: bool = True,
        pool: str | None = None,
        definite_errors: Sequence[type[BaseException]] = (),
        classify: ClassifyHook | None = None,
        unattended: str | None = None,
        effect_declared: bool = True,
    ) -> None:
        if not callable(func):
            raise ConfigurationError(f"a tool must be a function, got {type(func).__name__}")
        self.func = func
        self.name = name if name is not None else getattr(func, "__name__", "")
        _check_name("name", self.name, self.name)
        if namespace is not None:
            _check_name("namespace", namespace, self.name)
        self.namespace = namespace
        if not isinstance(version, str) or not version:
            raise ConfigurationError(f"tool {self.name!r}: version must be a non-empty string")
        self.version = version
        self.description = description if description is not None else inspect.getdoc(func) or ""
        if effect not in _EFFECTS:
            raise ConfigurationError(
                f"tool {self.name!r}: effect must be one of {', '.join(_EFFECTS)}, got {effect!r}"
            )
        self.effect: EffectClass = effect
        self.is_async = _is_async(func)
        self.timeout = _check_timeout(self.name, timeout, self.is_async)
        if timeout_behavior not in _TIMEOUT_BEHAVIORS:
            raise ConfigurationError(
                f"tool {self.name!r}: timeout_behavior must be one of: "
                + ", ".join(_TIMEOUT_BEHAVIORS)
            )
        self.timeout_behavior: TimeoutBehavior = timeout_behavior
        self.timeout_error_function = _optional_callable(
            self.name, "timeout_error_function", timeout_error_function
        )
        self.failure_error_function = _optional_callable(
            self.name, "failure_error_function", failure_error_function
        )
        if (
            needs_approval is not None
            and not isinstance(needs_approval, bool)
            and not callable(needs_approval)
        ):
            raise ConfigurationError(
                f"tool {self.name!r}: needs_approval must be a bool or a callable, "
                f"got {type(needs_approval).__name__}"
            )
        # None: the release gate decides, once the probe is known (it is declared later).
        self._declared_approval: bool | ApprovalFunction | None = needs_approval
        self.effect_declared = effect_declared
        if unattended is not None and (not isinstance(unattended, str) or not unattended.strip()):
            raise ConfigurationError(
                f"tool {self.name!r}: unattended must say why the tool may run without a "
                "human's approval and without a probe (a non-empty string)"
            )
        self.unattended_reason = unattended
        for error_type in definite_errors:
            if not (isinstance(error_type, type) and issubclass(error_type, BaseException)):
                raise ConfigurationError(
                    f"tool {self.name!r}: definite_errors must be exception classes, got "
                    f"{error_type!r}"
                )
        self.definite_errors: tuple[type[BaseException], ...] = tuple(definite_errors)
        self.classify_function = _optional_callable(self.name, "classify", classify)
        self.input_guardrails: tuple[InputGuardrail, ...] = _callables(
            self.name, "input_guardrails", input_guardrails
        )
        self.output_guardrails: tuple[OutputGuardrail, ...] = _callables(
            self.name, "output_guardrails", output_guardrails
        )
        if on_unknown is None:
            on_unknown = "report_now" if effect == "read_only" else "reconcile_then_report"
        if on_unknown not in _ON_UNKNOWN:
            raise ConfigurationError(
                f"tool {self.name!r}: on_unknown must be one of: {', '.join(_ON_UNKNOWN)}"
            )
        self.on_unknown: OnUnknown = on_unknown
        if not isinstance(is_enabled, bool):
            raise ConfigurationError(f"tool {self.name!r}: is_enabled must be a bool")
        self.is_enabled = is_enabled
        if pool is not None and (not isinstance(pool, str) or not pool):
            raise ConfigurationError(f"tool {self.name!r}: pool must be a non-empty string")
        self.pool = pool
        self.takes_context, self.args_model, self._positional = _analyse(func, self.name)
        self.probe_function: ProbeFunction | None = None
        self.compensate_function: CompensateFunction | None = None

    @property
    def lookup_key(self) -> str:
        """The name a model calls this tool by: ``namespace.name`` or ``name``."""
        return f"{self.namespace}.{self.name}" if self.namespace else self.name

    @property
    def parameters_schema(self) -> dict[str, Any]:
        """The JSON schema of the arguments, as published to the registry."""
        return self.args_model.model_json_schema()

    @property
    def needs_approval(self) -> bool | ApprovalFunction:
        """The declared approval policy, or the release gate's default when none was declared
        (see ``toolfleet.effects.gated_by_default``)."""
        if self._declared_approval is not None:
            return self._declared_approval
        return gated_by_default(
            self.effect,
            self.probe_function is not None,
            unattended_reason=self.unattended_reason,
            effect_declared=self.effect_declared,
        )

    def classify_failure(self, exc: BaseException, now: float) -> EffectVerdict:
        """What ``exc``, raised by the body after ``started``, proves about the effect."""
        return classify_exception(
            exc, definite=self.definite_errors, hook=self.classify_function, now=now
        )

    def probe(self, func: _ProbeT) -> _ProbeT:
        """Declare how to look the call up upstream by idempotency key (decorator)."""
        if self.probe_function is not None:
            raise ConfigurationError(f"tool {self.name!r} already declares a probe")
        self.probe_function = _optional_callable(self.name, "probe", func)
        return func

    def compensate(self, func: _CompensateT) -> _CompensateT:
        """Declare how to undo an applied call, given its original output (decorator)."""
        if self.compensate_function is not None:
            raise ConfigurationError(f"tool {self.name!r} already declares a compensate action")
        self.compensate_function = _optional_callable(self.name, "compensate", func)
        return func

    def spec(self, pool: str) -> ToolSpec:
        """The registry entry for this tool as served by a worker of ``pool``.

        A tool pinned to a pool of its own (``pool=...``) publishes that pool instead.
        """
        approval: Literal["never", "always", "callable"]
        if callable(self.needs_approval):
            approval = "callable"
        else:
            approval = "always" if self.needs_approval else "never"
        return ToolSpec(
            name=self.name,
            namespace=self.namespace,
            version=self.version,
            pool=self.pool or pool,
            description=self.description,
            parameters=self.parameters_schema,
            effect_class=self.effect,
            needs_approval=approval,
            on_unknown=self.on_unknown,
            timeout_s=self.timeout,
            enabled=self.is_enabled,
            has_probe=self.probe_function is not None,
            has_compensate=self.compensate_function is not None,
            effect_declared=self.effect_declared,
            sdk_tool=self.serves_sdk_tool,
            unattended_reason=self.unattended_reason,
            definite_errors=[f"{t.__module__}.{t.__qualname__}" for t in self.definite_errors],
            has_classify=self.classify_function is not None,
        )

    @property
    def serves_sdk_tool(self) -> bool:
        """Whether this tool is an Agents SDK function tool served unchanged."""
        return False

    def parse_arguments(self, arguments: str) -> dict[str, Any]:
        """Decode and validate raw JSON arguments into ``{parameter: value}``.

        Raises ModelBehaviorError worded as the SDK words it ("Invalid JSON input for tool
        {name}: ..."). An empty string means no arguments, as in the SDK.
        """
        base = f"Invalid JSON input for tool {self.name}"
        try:
            data = json.loads(arguments) if arguments else {}
        except (ValueError, RecursionError) as exc:
            raise ModelBehaviorError(f"{base}: {cut_text(arguments, 1_024)}") from exc
        if not isinstance(data, dict):
            raise ModelBehaviorError(f"{base}: expected a JSON object")
        try:
            model = self.args_model.model_validate(data)
        except ValidationError as exc:
            raise ModelBehaviorError(f"{base}: {exc}") from exc
        # Not dict(model): dict() first asks the model for .keys, which pydantic answers
        # through its slow __getattr__ and an AttributeError, on every call.
        return dict(iter(model))

    def parse_arguments_for_approval(self, arguments: str) -> dict[str, Any] | None:
        """Like ``parse_arguments`` but stricter, and None instead of an error.

        An approval policy only ever sees arguments that are certain: empty text, non-standard
        JSON constants (NaN, Infinity), non-objects and invalid values all give None, which the
        runner treats as "approval required" (fail closed), as the SDK does.
        """
        if not arguments.strip():
            return None
        try:
            data = json.loads(arguments, parse_constant=_reject_constant)
        except (ValueError, RecursionError):
            return None
        if not isinstance(data, dict):
            return None
        try:
            return dict(self.args_model.model_validate(data))
        except ValidationError:
            return None

    async def invoke(self, ctx: ToolContext, args: dict[str, Any]) -> Any:
        """Call the function with validated arguments; sync functions run in a thread."""
        positional: list[Any] = [ctx] if self.takes_context else []
        keywords: dict[str, Any] = {}
        for param, value in args.items():
            if param in self._positional:
                positional.append(value)
            else:
                keywords[param] = value
        if self.is_async:
            return await self.func(*positional, **keywords)
        result = await asyncio.to_thread(self.func, *positional, **keywords)
        if inspect.isawaitable(result):  # a sync wrapper handing back a coroutine
            result = await result
        return result

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Call the underlying function directly (no validation, guardrails or timeout)."""
        return self.func(*args, **kwargs)

    def __repr__(self) -> str:
        return f"Tool({self.lookup_key!r}, effect={self.effect!r}, version={self.version!r})"


def _reject_constant(value: str) -> Any:
    raise ValueError(f"non-standard JSON constant {value}")


def _check_name(what: str, value: object, tool: str) -> None:
    if not isinstance(value, str) or not _NAME.match(value):
        raise ConfigurationError(
            f"tool {tool!r}: {what} {value!r} must be 1-64 characters of letters, digits, "
            "'_' or '-'"
        )


def _check_timeout(name: str, timeout: object, is_async: bool) -> float | None:
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, int | float):
        raise ConfigurationError(
            f"tool {name!r}: timeout must be a positive number in seconds or None."
        )
    seconds = float(timeout)
    if not math.isfinite(seconds):
        raise ConfigurationError(f"tool {name!r}: timeout must be a finite number.")
    if seconds <= 0:
        raise ConfigurationError(f"tool {name!r}: timeout must be greater than 0.")
    if not is_async:
        raise ConfigurationError(
            f"tool {name!r}: timeout is only supported for async tool functions; a sync "
            "function runs in a thread that cannot be stopped. Make it async or drop the timeout."
        )
    return seconds


_F = TypeVar("_F")


def _optional_callable(tool: str, what: str, func: _F) -> _F:
    if func is not None and not callable(func):
        raise ConfigurationError(f"tool {tool!r}: {what} must be callable or None.")
    return func


def _callables(tool: str, what: str, items: Sequence[_F]) -> tuple[_F, ...]:
    if isinstance(items, str | bytes) or not isinstance(items, Sequence):
        raise ConfigurationError(f"tool {tool!r}: {what} must be a list of callables")
    for item in items:
        if not callable(item):
            raise ConfigurationError(
                f"tool {tool!r}: {what} must be a list of callables, got {type(item).__name__}"
            )
    return tuple(items)


def _is_async(func: Callable[..., Any]) -> bool:
    if inspect.iscoroutinefunction(func):
        return True
    # A callable object with ``async def __call__``.
    return inspect.iscoroutinefunction(getattr(func, "__call__", None))  # noqa: B004


def _is_context_annotation(annotation: object) -> bool:
    if annotation is ToolContext:
        return True
    if isinstance(annotation, str):  # unresolved, e.g. a callable object's string annotation
        return annotation.rsplit(".", 1)[-1] == "ToolContext"
    if get_origin(annotation) is Annotated:
        return _is_context_annotation(get_args(annotation)[0])
    return False


def _analyse(func: Callable[..., Any], name: str) -> tuple[bool, type[BaseModel], frozenset[str]]:
    """Read the signature: does it take a context, and what model validates the rest?"""
    try:
        signature = inspect.signature(func)
    except (TypeError, ValueError) as exc:
        raise ConfigurationError(f"tool {name!r}: cannot read the signature ({exc})") from exc
    try:
        hints = get_type_hints(func, include_extras=True)
    except TypeError:  # not a plain function (callable object, partial): use what is declared
        hints = {
            p.name: p.annotation
            for p in signature.parameters.values()
            if p.annotation is not inspect.Parameter.empty
        }
    except Exception as exc:
        raise ConfigurationError(
            f"tool {name!r}: cannot resolve the parameter annotations ({exc}); define the "
            "types it uses at module level"
        ) from exc
    params = list(signature.parameters.values())
    takes_context = bool(params) and (
        params[0].name == "ctx" or _is_context_annotation(hints.get(params[0].name))
    )
    if takes_context:
        params = params[1:]
    fields: dict[str, Any] = {}
    positional: set[str] = set()
    for param in params:
        if param.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
            raise ConfigurationError(
                f"tool {name!r}: *args and **kwargs cannot be described to a model; "
                "declare every parameter"
            )
        annotation = hints.get(param.name, Any)
        if _is_context_annotation(annotation):
            raise ConfigurationError(f"tool {name!r}: ToolContext must be the first parameter")
        if param.kind is inspect.Parameter.POSITIONAL_ONLY:
            positional.add(param.name)
        default = ... if param.default is inspect.Parameter.empty else param.default
        fields[param.name] = (annotation, default)
    try:
        # Named as the SDK names it, so validation errors read the same ("... for {name}_args").
        model: type[BaseModel] = create_model(
            f"{name}_args",
            __config__=ConfigDict(extra="forbid", protected_namespaces=()),
            **fields,
        )
        model.model_json_schema()  # fail at declaration, not at the first call
    except Exception as exc:
        raise ConfigurationError(
            f"tool {name!r}: its parameters cannot be validated with pydantic ({exc})"
        ) from exc
    return takes_context, model, frozenset(positional)
