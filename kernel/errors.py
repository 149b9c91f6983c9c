"""The one exception tree of toolfleet: every error it raises is a ``ToolfleetError``.

Catch the branch that says what you can do about it::

    ToolfleetError                       (schemas) root; the message says what to do next
    ├── UsageError                       used wrongly: fix the call, flag or declaration
    │   ├── ConfigurationError           a setting, flag or tool declaration is invalid
    │   │   ├── TopicsMissingError       (kernel.adapters.topics) topics to create on purpose
    │   │   ├── StateVersionError        (kernel.stores.schema) the state is of a version this
    │   │   │                            release does not read: run the release it names
    │   │   └── StartRefused             (kernel.adapters.dependencies) Kafka or Redis refused
    │   │                                this process (credentials, TLS, a cluster node URL)
    │   ├── MissingExtraError            an optional part is not installed (also an ImportError):
    │   │                                pip install 'toolfleet[<extra>]', as its message says
    │   ├── ToolNotFoundError            a call names a tool that no worker pool publishes
    │   ├── NotFoundError                (toolfleet.app.operations) no such task, call, tool
    │   ├── AlreadyDecidedError          (toolfleet.app.operations) decided already, or ran
    │   ├── SelectionChangedError        (toolfleet.app.bulk) a bulk action's targets changed
    │   │                                since they were shown: look again, then confirm
    │   ├── InvalidQueryError            (kernel.stores.history) a history search that cannot be
    │   │   └── InvalidCursorError       a page cursor that is not one the history gave
    │   ├── JournalError                 (toolfleet.testing.sim) a campaign's journal is not one,
    │   │                                or names other code, faults or seeds: start a new one
    │   └── NotAllowedError              (toolfleet.app.operations) another tenant's data, or
    │       │                            fleet-wide, for an operator scoped to one tenant
    │       ├── NotAuthenticatedError    (toolfleet.app.console) not signed in (HTTP 401)
    │       └── CrossSiteRequestError    (toolfleet.app.console) not sent by the console's page
    ├── UnavailableError                 a dependency is away: retry, nothing is wrong with you
    │   ├── InfrastructureError          Kafka or Redis could not be started, reached or stopped
    │   │   ├── CutOffError              this instance lost Kafka or Redis past the cut-off bound
    │   │   ├── DependencyUnavailable    (kernel.adapters.dependencies) a check got no answer
    │   │   ├── IndefiniteOutcome        (kernel.adapters.bus) a transaction's outcome is unknown:
    │   │   │                            its producer was re-initialised; redo it if not committed
    │   │   ├── UnreplicatedWriteError   no replica confirmed a durable write (WAIT) in time
    │   │   └── StateMayBeLostError      a Redis connection was lost with work in hand: a
    │   │                                failover may have taken its writes back; it is redone
    │   └── TurnTimeoutError             (toolfleet.client; also a TimeoutError) no result in time
    ├── InvalidMessageError              (schemas) a message fails its schema: dead-lettered
    ├── SlotGroupsError                  (toolfleet.testing.sim) the simulator cannot run with
    │                                    fewer slot groups: a module derived a value from them
    ├── ModelBehaviorError               the model's calls cannot run safely (reused/empty ids)
    ├── BackgroundTaskEnded              (kernel.adapters.background) a service's background
    │                                    loop returned while it ran (a bug): the service stopped
    ├── NotExecuted                      (kernel.rules.effects) raised by a tool: upstream refused
    ├── ToolExecutionError               a tool failed in a way that fails the turn
    │   ├── ToolTimeoutError             (kernel.tools) the SDK's timeout, as in-process
    │   │   └── HeartbeatTimeoutError    no heartbeat within the tool's heartbeat timeout
    │   ├── ToolCancelledError           (kernel.tools) the tool itself was cancelled
    │   ├── ToolInputGuardrailTripwireTriggered   (kernel.tools)
    │   └── ToolOutputGuardrailTripwireTriggered  (kernel.tools)
    ├── FleetToolError                   (toolfleet.agents) a tool's exception on a worker, for
    │                                    RunConfig.tool_error_formatter (class name and text)
    └── FleetRunError                    (toolfleet.agents; also an SDK AgentsException)
        ├── FleetTurnError               a call's failure with no SDK class to stand for it
        ├── FleetRunCancelled            the run was cancelled on the fleet
        ├── FleetToolNotServed           no worker serves a tool the run called
        └── FleetApprovalRequired        the fleet holds a call for an operator's approval

The root and ``InvalidMessageError`` are defined in ``schemas`` (the lowest layer, so the wire
models can raise them) and re-exported here.
"""

from __future__ import annotations

from schemas import InvalidMessageError, ToolfleetError

__all__ = [
    "ConfigurationError",
    "CutOffError",
    "InfrastructureError",
    "InvalidMessageError",
    "MissingExtraError",
    "ModelBehaviorError",
    "ToolExecutionError",
    "ToolNotFoundError",
    "ToolfleetError",
    "UnavailableError",
    "UnreplicatedWriteError",
    "UsageError",
]


class UsageError(ToolfleetError):
    """toolfleet was used wrongly; retrying the same thing fails the same way: fix it first."""


class UnavailableError(ToolfleetError):
    """A dependency (Kafka, Redis, the fleet) is unavailable right now; retry after a while."""


class ConfigurationError(UsageError):
    """A setting, flag or tool declaration is invalid; fix the configuration and restart."""


class MissingExtraError(UsageError, ImportError):
    """A part of toolfleet needs an optional package that is not installed: ``what`` needs
    ``missing``, which the extra ``extra`` installs (``pip install 'toolfleet[console]'``).
    Also an ``ImportError``, so ``except ImportError`` around an optional import catches it."""

    def __init__(self, what: str, *, extra: str, missing: str | None) -> None:
        package = f"{missing!r}, which is not installed" if missing else "a package not installed"
        super().__init__(f"{what} needs {package}: pip install 'toolfleet[{extra}]'")
        self.extra = extra
        """The extra that installs what is missing (agents, console, otlp, containers)."""
        self.name = missing  # ImportError's own field: the module that could not be imported


class ToolNotFoundError(UsageError):
    """A call names a tool no worker pool has published; publish the tool or fix the call."""


class InfrastructureError(UnavailableError):
    """Kafka or Redis could not be started, reached or stopped; the message names which and why."""


class CutOffError(InfrastructureError):
    """This instance could not reach Kafka or Redis for longer than the cut-off bound while
    its peers may: it gives up its partitions, waits until both answer, and rejoins."""


class UnreplicatedWriteError(InfrastructureError):
    """The Redis primary applied a durable write, but too few replicas acknowledged it within
    the WAIT timeout, so a failover could lose it. A call whose ``started`` this was never
    runs: it counts as started, effect unknown, for the reconciler to resolve. Check the
    replicas (``INFO replication``) or TOOLFLEET_REDIS_WAIT_TIMEOUT_MS."""


class StateMayBeLostError(InfrastructureError):
    """A connection to Redis was lost while work was in hand: a failover may have taken back
    writes no replica had, so nothing that depends on them is sent to Kafka (no record, no
    offset); the work is done again from the last committed offsets. Nothing to do unless it
    repeats: then check the primary and its replicas (``INFO replication``)."""


class ModelBehaviorError(ToolfleetError):
    """The model produced tool calls that cannot be executed safely (reused or empty call IDs)."""


class ToolExecutionError(ToolfleetError):
    """A tool failed in a way its failure policy turns into a failed turn."""
