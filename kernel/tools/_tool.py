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
import copy
import functools
import inspect
import json
import math
import re
from collections.abc import Awaitable, Callable, Sequence
from typing import (
    Annotated,
    Any,
    Literal,
    TypedDict,
    TypeVar,
    Unpack,
    get_args,
    get_origin,
    get_type_hints,
)

from pydantic import BaseModel, ConfigDict, ValidationError, create_model

from kernel.errors import ConfigurationError, ModelBehaviorError
from kernel.rules.approvals import approval_arguments
from kernel.rules.effects import ClassifyHook, EffectVerdict, classify_exception, gated_by_default
from kernel.rules.limits import cut_text
from kernel.rules.texts import DEFAULT_ERROR
from kernel.tools._context import ProbeResult, ToolContext
from kernel.tools._guardrails import InputGuardrail, OutputGuardrail
from schemas import EffectClass, ToolSpec

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
"""What the model is told while an effect is unknown (see docs/concepts/recovery.md)."""

_ProbeT = TypeVar("_ProbeT", bound=ProbeFunction)
_CompensateT = TypeVar("_CompensateT", bound=CompensateFunction)

_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # the function-name rule of the OpenAI APIs
_EFFECTS: tuple[EffectClass, ...] = get_args(EffectClass)
_TIMEOUT_BEHAVIORS: tuple[TimeoutBehavior, ...] = get_args(TimeoutBehavior)
_ON_UNKNOWN: tuple[OnUnknown, ...] = get_args(OnUnknown)


class FleetOptions(TypedDict, total=False):
    """toolfleet's own options of a tool, beyond the Agents SDK's (every key optional).

    The one place they are spelled out: ``ToolRegistry.tool`` and ``Tool`` take them as part of
    ``ToolOptions``, ``ToolRegistry.add_function_tool`` takes them for an SDK function tool.
    """

    version: str
    """Served side by side with the tool's other versions (default "1")."""
    effect: EffectClass | None
    """read_only | idempotent | non_idempotent | irreversible. Left out or None: non_idempotent
    (for an SDK function tool: non_idempotent, but the SDK's approval behaviour is kept)."""
    on_unknown: OnUnknown | None
    """What the model is told when the effect is unknown: "report_now" (the SDK's texts; the
    default for read_only tools and SDK function tools) or "reconcile_then_report"."""
    pool: str | None
    """Serve the tool only in this pool (default: every pool serving the registry)."""
    definite_errors: Sequence[type[BaseException]]
    """Exception types that prove nothing took effect (the tool's own validation errors):
    not executed, never retried, no human task."""
    classify: ClassifyHook | None
    """``classify(exc) -> EffectVerdict | None``: the tool's own mapping of exceptions
    (None: the standard table of ``kernel.rules.effects``)."""
    unattended: str | None
    """Run a gated tool without approval anyway, for this reason (published to the registry
    and printed by ``toolfleet tools review``)."""
    schedule_to_start: float | None
    """Seconds from the call's command being issued (admission waits included) to its start:
    a call not started by then never starts (not_executed, the model is told)."""
    heartbeat: float | None
    """Seconds a running body may go without ``ctx.heartbeat``: then it is cancelled and its
    effect is unknown (probed). Async functions only."""


class ToolOptions(FleetOptions, total=False):
    """Every option of a toolfleet tool: the Agents SDK's own, and ``FleetOptions``."""

    name: str | None
    """Defaults to the function's name."""
    description: str | None
    """Defaults to the function's docstring."""
    namespace: str | None
    """The model calls the tool ``namespace.name``."""
    timeout: float | None
    """Seconds, async functions only: the start-to-close timeout."""
    start_to_close: float | None
    """Temporal's name for ``timeout`` (give one of them, or both equal)."""
    timeout_behavior: TimeoutBehavior
    """"error_as_result" (default: the SDK's timeout text, or ``timeout_error_function``) or
    "raise_exception" (the turn fails with ToolTimeoutError)."""
    timeout_error_function: ToolErrorFunction | None
    """``(ctx, err) -> str``: words a timeout for the model."""
    failure_error_function: ToolErrorFunction | None
    """``(ctx, exc) -> str``: words a failure for the model (default: the SDK's fixed text);
    None makes any failure fail the turn."""
    needs_approval: bool | ApprovalFunction | None
    """bool or ``(ctx, args) -> bool``; None (default): the release gate decides: True for
    irreversible tools and for non_idempotent tools without a probe."""
    input_guardrails: Sequence[InputGuardrail]
    """Run immediately before the body; may reject the call or fail the turn."""
    output_guardrails: Sequence[OutputGuardrail]
    """Run before the output is accepted."""
    is_enabled: bool
    """A disabled tool is published but refused."""


_Choice = TypeVar("_Choice", bound=str)


def _choice(tool: str, option: str, value: object, allowed: tuple[_Choice, ...]) -> _Choice:
    """``value`` when it is one of ``allowed``; else a ConfigurationError naming them."""
    for choice in allowed:
        if value == choice:
            return choice
    raise ConfigurationError(
        f"tool {tool!r}: {option} must be one of: {', '.join(allowed)}; got {value!r}"
    )


def _check_known(tool: str, options: ToolOptions) -> None:
    """A misspelt option is an error here, not silently ignored."""
    unknown = sorted(set(options) - ToolOptions.__optional_keys__)
    if unknown:
        raise ConfigurationError(
            f"tool {tool!r}: unknown option(s) {', '.join(unknown)}; "
            f"the options are: {', '.join(sorted(ToolOptions.__optional_keys__))}"
        )


def _check_approval(
    tool: str, needs_approval: bool | ApprovalFunction | None
) -> bool | ApprovalFunction | None:
    if needs_approval is None or isinstance(needs_approval, bool) or callable(needs_approval):
        return needs_approval
    raise ConfigurationError(
        f"tool {tool!r}: needs_approval must be a bool or a callable, "
        f"got {type(needs_approval).__name__}"
    )


def _check_unattended(tool: str, reason: str | None) -> str | None:
    if reason is not None and (not isinstance(reason, str) or not reason.strip()):
        raise ConfigurationError(
            f"tool {tool!r}: unattended must say why the tool may run without a "
            "human's approval and without a probe (a non-empty string)"
        )
    return reason


def _check_definite(
    tool: str, errors: Sequence[type[BaseException]]
) -> tuple[type[BaseException], ...]:
    for error_type in errors:
        if not (isinstance(error_type, type) and issubclass(error_type, BaseException)):
            raise ConfigurationError(
                f"tool {tool!r}: definite_errors must be exception classes, got {error_type!r}"
            )
    return tuple(errors)


def default_tool_error_function(ctx: ToolContext, error: Exception) -> str:
    """The SDK's default failure text; the exception itself is never shown to the model."""
    return DEFAULT_ERROR


class Tool:
    """A registered tool; build it with ``ToolRegistry.tool``. Calling it calls the function."""

    def __init__(
        self,
        func: Callable[..., Any],
        *,
        effect_declared: bool = True,
        **options: Unpack[ToolOptions],
    ) -> None:
        name = options.get("name")
        namespace = options.get("namespace")
        version = options.get("version", "1")
        effect = options.get("effect") or "non_idempotent"
        timeout_behavior = options.get("timeout_behavior", "error_as_result")
        on_unknown = options.get("on_unknown")
        is_enabled = options.get("is_enabled", True)
        pool = options.get("pool")
        if not callable(func):
            raise ConfigurationError(f"a tool must be a function, got {type(func).__name__}")
        self.func = func
        self.name = name if name is not None else getattr(func, "__name__", "")
        _check_name("name", self.name, self.name)
        _check_known(self.name, options)
        if namespace is not None:
            _check_name("namespace", namespace, self.name)
        self.namespace = namespace
        if not isinstance(version, str) or not version:
            raise ConfigurationError(f"tool {self.name!r}: version must be a non-empty string")
        self.version = version
        description = options.get("description")
        self.description = description if description is not None else inspect.getdoc(func) or ""
        self.effect: EffectClass = _choice(self.name, "effect", effect, _EFFECTS)
        self.is_async = _is_async(func)
        self.timeout = _check_timeout(
            self.name, _start_to_close(self.name, options), self.is_async, "timeout"
        )
        self.heartbeat_timeout = _check_timeout(
            self.name, options.get("heartbeat"), self.is_async, "heartbeat"
        )
        self.schedule_to_start = _check_timeout(
            self.name, options.get("schedule_to_start"), True, "schedule_to_start"
        )
        self.timeout_behavior: TimeoutBehavior = _choice(
            self.name, "timeout_behavior", timeout_behavior, _TIMEOUT_BEHAVIORS
        )
        self.timeout_error_function = _optional_callable(
            self.name, "timeout_error_function", options.get("timeout_error_function")
        )
        self.failure_error_function = _optional_callable(
            self.name,
            "failure_error_function",
            options.get("failure_error_function", default_tool_error_function),
        )
        # None: the release gate decides, once the probe is known (it is declared later).
        self._declared_approval = _check_approval(self.name, options.get("needs_approval"))
        self.effect_declared = effect_declared
        self.unattended_reason = _check_unattended(self.name, options.get("unattended"))
        self.definite_errors = _check_definite(self.name, options.get("definite_errors", ()))
        self.classify_function = _optional_callable(self.name, "classify", options.get("classify"))
        self.input_guardrails: tuple[InputGuardrail, ...] = _callables(
            self.name, "input_guardrails", options.get("input_guardrails", ())
        )
        self.output_guardrails: tuple[OutputGuardrail, ...] = _callables(
            self.name, "output_guardrails", options.get("output_guardrails", ())
        )
        if on_unknown is None:
            on_unknown = "report_now" if effect == "read_only" else "reconcile_then_report"
        self.on_unknown: OnUnknown = _choice(self.name, "on_unknown", on_unknown, _ON_UNKNOWN)
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
        """The JSON schema of the arguments, as published to the registry (a copy)."""
        return copy.deepcopy(self._schema)

    @functools.cached_property
    def _schema(self) -> dict[str, Any]:
        # Built once: a worker publishes its tools' specs with every status report.
        return self.args_model.model_json_schema()

    @property
    def needs_approval(self) -> bool | ApprovalFunction:
        """The declared approval policy, or the release gate's default when none was declared
        (see ``kernel.rules.effects.gated_by_default``)."""
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
            schedule_to_start_s=self.schedule_to_start,
            heartbeat_timeout_s=self.heartbeat_timeout,
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

        An approval policy only ever sees arguments that are certain: what
        ``kernel.rules.approvals.approval_arguments`` refuses (empty text, non-standard JSON
        constants, non-objects) and values the tool's schema refuses all give None, which the
        runner treats as "approval required" (fail closed), as the SDK does.
        """
        data = approval_arguments(arguments)
        if data is None:
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


def _check_name(what: str, value: object, tool: str) -> None:
    if not isinstance(value, str) or not _NAME.match(value):
        raise ConfigurationError(
            f"tool {tool!r}: {what} {value!r} must be 1-64 characters of letters, digits, "
            "'_' or '-'"
        )


def _start_to_close(name: str, options: ToolOptions) -> float | None:
    """``timeout`` or its other name ``start_to_close``; both given must agree."""
    timeout, start_to_close = options.get("timeout"), options.get("start_to_close")
    if timeout is not None and start_to_close is not None and timeout != start_to_close:
        raise ConfigurationError(
            f"tool {name!r}: timeout and start_to_close are one setting (the start-to-close "
            f"timeout) and differ ({timeout!r}, {start_to_close!r}): give one of them"
        )
    return timeout if timeout is not None else start_to_close


def _check_timeout(
    name: str, timeout: object, is_async: bool, option: str = "timeout"
) -> float | None:
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, int | float):
        raise ConfigurationError(
            f"tool {name!r}: {option} must be a positive number in seconds or None."
        )
    seconds = float(timeout)
    if not math.isfinite(seconds):
        raise ConfigurationError(f"tool {name!r}: {option} must be a finite number.")
    if seconds <= 0:
        raise ConfigurationError(f"tool {name!r}: {option} must be greater than 0.")
    if not is_async:
        raise ConfigurationError(
            f"tool {name!r}: {option} is only supported for async tool functions; a sync "
            f"function runs in a thread that cannot be stopped. Make it async or drop the "
            f"{option}."
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
