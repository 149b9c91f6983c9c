"""Settings shared by every toolfleet service, read from the environment (prefix TOOLFLEET_)."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Literal

from pydantic import AliasChoices, Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

LEDGER_RETENTION_S = 7 * 24 * 3600
"""How long a committed call whose history is its plain run stays in the ledger, by default."""

TRACEBACK_REDACT_PATTERN = (
    # key=value, key: value, "key": "value", Authorization: Bearer ... (the key stays)
    # (a key is a whole run of [\w.-] that holds a keyword, taken possessively: linear time)
    r"(?i)(?<![\w.-])(?=[\w.-]*?(?:passw(?:or)?d|pwd|secret|token|api[_-]?key|access[_-]?key"
    r"|private[_-]?key|credentials?|authorization|cookie|session[_-]?id))[\w.-]*+[\"']?\s*[:=]\s*"
    r"(?:\"([^\"\n]*)\"|'([^'\n]*)'|(?:(?:bearer|basic|token|digest)\s+)?([^\s\"',;&)}\]]+))"
    # token abc..., Bearer abc... in prose
    r"|\b(?:bearer|token)\s+([\w.~+/=-]{8,})"
    # well-known key formats: OpenAI/Anthropic sk-, GitHub, Slack, AWS access key ids, JWTs
    r"|(?<![\w-])(sk-[\w-]{16,}|gh[pousr]_\w{30,}|xox[abprs]-[\w-]{10,}|AKIA[0-9A-Z]{16}"
    r"|eyJ[\w-]{8,}\.[\w-]{8,}\.[\w-]+)"
    # user:password@ in a URL
    r"|://[^\s/:@]+:([^\s/@]+)@"
)
"""The secrets taken out of a tool failure's message and traceback by default (the setting
``traceback_redact_pattern``): what its groups matched, or the whole match without groups."""


def _xdg(var: str, fallback: str) -> Path:
    return Path(os.environ.get(var) or Path.home() / fallback) / "toolfleet"


class Settings(BaseSettings):
    """Where the services find Kafka and Redis and how they name topics.

    ``KAFKA_BOOTSTRAP_SERVERS`` and ``REDIS_URL`` are read without the prefix too, because
    they are the names platforms already export; when either is set, ``toolfleet infra up``
    starts nothing and everything uses the given services.
    """

    model_config = SettingsConfigDict(env_prefix="TOOLFLEET_", extra="ignore")

    kafka_bootstrap_servers: str | None = Field(
        default=None,
        description="Kafka's bootstrap servers, host:port[,host:port...] (unset: the broker "
        "toolfleet infra up runs, 127.0.0.1 on kafka_port)",
        validation_alias=AliasChoices(
            "KAFKA_BOOTSTRAP_SERVERS", "TOOLFLEET_KAFKA_BOOTSTRAP_SERVERS"
        ),
    )
    redis_url: str | None = Field(
        default=None,
        description="The Redis that holds the fleet's state: redis://, rediss://, unix://, "
        "redis+cluster:// or redis+sentinel:// (unset: the server toolfleet infra up runs, "
        "127.0.0.1 on redis_port)",
        validation_alias=AliasChoices("REDIS_URL", "TOOLFLEET_REDIS_URL"),
    )
    redis_max_connections: int = Field(default=128, ge=4, description="Per process")

    # Secured connections (kernel/adapters/security.py applies them to every client).
    kafka_security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = Field(
        default="PLAINTEXT", description="How this process talks to Kafka"
    )
    kafka_sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER"] = Field(
        default="PLAIN", description="SASL mechanism, with a SASL_* security protocol"
    )
    kafka_sasl_username: str | None = Field(default=None, description="SASL user (not OAUTH)")
    kafka_sasl_password: SecretStr | None = Field(default=None, description="SASL password")
    kafka_sasl_oauth_token_provider: str | None = Field(
        default=None,
        description="OAUTHBEARER: 'module:attribute' naming an aiokafka AbstractTokenProvider "
        "(an instance, or a class or factory that makes one)",
    )
    kafka_ssl_cafile: Path | None = Field(
        default=None, description="CA bundle that signed the brokers' certificates (PEM)"
    )
    kafka_ssl_certfile: Path | None = Field(
        default=None, description="Client certificate chain (PEM), for brokers that ask for one"
    )
    kafka_ssl_keyfile: Path | None = Field(default=None, description="Its private key (PEM)")
    kafka_ssl_key_password: SecretStr | None = Field(default=None, description="Its password")
    kafka_ssl_check_hostname: bool = Field(
        default=True, description="Verify that a broker's certificate names its host"
    )
    redis_tls_ca_certs: Path | None = Field(
        default=None, description="rediss://: CA bundle that signed the server's certificate"
    )
    redis_tls_certfile: Path | None = Field(
        default=None, description="rediss://: client certificate (PEM), if the server asks"
    )
    redis_tls_keyfile: Path | None = Field(default=None, description="Its private key (PEM)")
    tenant_max_concurrency: int | None = Field(
        default=None,
        ge=1,
        description="Calls one tenant may have admitted at once, fleet-wide, unless "
        "`toolfleet tenants set` says otherwise (None: no quota)",
    )
    tenant_weight: float = Field(
        default=1.0,
        gt=0,
        description="A tenant's share of capacity among tenants with waiting calls, unless set",
    )
    tenant_rate: float | None = Field(
        default=None, gt=0, description="Calls per second one tenant may start, unless set"
    )
    tenant_burst: int | None = Field(
        default=None, ge=1, description="Calls a tenant's rate bucket holds (default 1)"
    )
    admission_tick_ms: int = Field(
        default=50,
        ge=5,
        description="How often each planner refills rate buckets, withdraws calls past their "
        "deadline and republishes commands a lost planner admitted",
    )
    admission_lease_s: float = Field(
        default=900.0,
        gt=0,
        description="An admitted call whose outcome never arrives frees its slots after this",
    )
    worker_capacity_ttl_s: float = Field(
        default=15.0,
        gt=0,
        description="A worker's slots count in its pool's capacity this long after it last "
        "registered them (it registers every third of it)",
    )
    redis_wait_replicas: int = Field(
        default=1,
        ge=0,
        description="Replicas that must acknowledge a call's `started` write (Redis WAIT) "
        "before its body runs, its end before its outcome is published, and every service's "
        "writes before it sends a record or commits an offset, when the primary has that many "
        "(fewer: as many as it has; none: no WAIT). 0 never waits (a failover may then take "
        "back writes that Kafka already depends on)",
    )
    redis_wait_timeout_ms: int = Field(
        default=1000,
        ge=1,
        description="How long `started` waits for the replicas; past it the call never runs "
        "and its effect is unknown (UnreplicatedWriteError)",
    )
    topic_prefix: str = Field(
        default="toolfleet.",
        description="Starts every topic's name; also names the deployment's Redis keys (under "
        "tf: for the default, tf:<prefix without its dot>: otherwise)",
    )
    partitions: int = Field(
        default=6,
        ge=1,
        description="Partitions of each topic this deployment creates (unless topic_partitions "
        "says otherwise). A topic's partitions are the most instances of one consumer group "
        "that get work: planners, aggregators, reconcilers, the workers of one pool",
    )
    topic_partitions: dict[str, int] = Field(
        default_factory=dict,
        description="Partitions per logical topic, overriding partitions, as JSON in the "
        'environment, e.g. {"commands.payments": 24, "outcomes": 12}',
    )
    replication_factor: int = Field(
        default=1,
        ge=1,
        description="Replicas of each topic this deployment creates (unless "
        "topic_replication_factors says otherwise); 3 on a production cluster",
    )
    topic_replication_factors: dict[str, int] = Field(
        default_factory=dict,
        description="Replication factor per logical topic, overriding replication_factor, as "
        'JSON in the environment, e.g. {"dead-letter": 3}',
    )
    topics_auto_create: bool = Field(
        default=True,
        description="Services create missing topics at start (local development). Off in "
        "production: topics are created on purpose (toolfleet topics apply, or the KafkaTopic "
        "resources of toolfleet topics plan --strimzi), and a service that finds one missing "
        "waits, naming it",
    )
    metrics_port: int = Field(default=0, ge=0, description="0 picks a free port")
    metrics_tool_label: bool = Field(
        default=True,
        description="Histograms carry each call's tool in their tool label. Off for a fleet "
        'with many tools: the label keeps one value, "*" (kernel.adapters.metrics.ALL_TOOLS), '
        "so queries stay valid and a pool exports one histogram, not one per tool",
    )
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field(
        default="INFO", description="The lowest level a service logs (JSON lines on stderr)"
    )
    traces: Literal["off", "otlp", "log"] = Field(
        default="off",
        description="OpenTelemetry spans: otlp exports them over OTLP/HTTP (endpoint, headers "
        "and sampler from the standard OTEL_* variables), log writes them as JSON log lines; "
        "off records none (trace context still travels)",
    )
    kafka_linger_ms: int = Field(
        default=0,
        ge=0,
        description="How long a producer holds a record to batch it with the next ones (every "
        "producer of the fleet and of its clients). 0: records still share a request under "
        "load (those that arrive while one is in flight go in the next), and an idle turn "
        "does not wait on each of its hops",
    )
    kafka_request_timeout_ms: int = Field(
        default=40_000,
        ge=1_000,
        description="How long a producer waits for the broker's answer to one request. Past "
        "it the request's outcome is unknown: the aggregator's transactional producer is "
        "re-initialised (its old epoch fenced) before it sends anything else, and an "
        "idempotent producer sends the same batch again, which the broker recognises",
    )
    session_timeout_ms: int = Field(
        default=10_000,
        ge=6_000,
        description="Consumer group session: how soon a dead process's partitions move on",
    )

    gc_thresholds: tuple[int, int, int] = Field(
        default=(100_000, 20, 40),
        description="gc.set_threshold for every service (see toolfleet.app.service.tune_gc); "
        "as JSON in the environment, e.g. [100000, 20, 40]",
    )
    aggregator_transaction_interval_ms: int = Field(
        default=20,
        ge=0,
        description="Least time between two of the aggregator's Kafka transactions: under "
        "load its batches grow instead of their number (each one costs the broker several "
        "requests and markers)",
    )

    identity_scope: Literal["run", "tenant"] = Field(
        default="run",
        description="What a call id is unique within: its run, as the Agents SDK has it, or "
        "the tenant (also refuses a model response replayed under a new run id)",
    )
    client_result_window_s: float = Field(
        default=300.0,
        gt=0,
        description="How long a FleetClient keeps the result of a turn it submitted before "
        "anyone asks for it (a result nobody claims in that window is dropped)",
    )
    client_max_results: int = Field(
        default=10_000,
        ge=1,
        description="Unclaimed results a FleetClient keeps at most (the oldest go first)",
    )

    ledger_retention_s: int = Field(
        default=LEDGER_RETENTION_S,
        ge=0,
        description="How long a committed call whose history is its plain run stays in the "
        "ledger (0: forever). A model that reuses an expired call's id runs it again, so keep "
        "it longer than any run can be replayed or resumed",
    )

    cut_off_after_s: float = Field(
        default=30.0,
        gt=0,
        description="How long an instance retries one record against an unreachable Kafka or "
        "Redis before it gives up its partitions to its peers (it rejoins once both answer)",
    )
    progress_min_interval_s: float = Field(
        default=0.25,
        ge=0,
        description="Least time between two progress events of one call that a worker "
        "publishes (ctx.report_progress); the newest report in between is held back and sent "
        "when the time comes, or when the call ends",
    )

    # Who may decide (see kernel/rules/auth.py).
    decision_auth: Literal["hmac", "off"] = Field(
        default="hmac",
        description="Verify the signature of approvals, cancellations and task resolutions; "
        "'off' for local development only",
    )
    decision_keys: dict[str, str] = Field(
        default_factory=dict,
        description='Per-tenant decision keys as JSON, {"tenant": "secret"}; "*" is the key of '
        "every tenant without its own",
    )
    decision_keys_file: Path | None = Field(
        default=None, description="The same JSON in a file (a mounted secret)"
    )

    # Size limits (see kernel/rules/limits.py): nothing produced may be too big for Kafka.
    max_message_bytes: int = Field(
        default=1_000_000,
        ge=65_536,
        description="Largest record toolfleet produces (keep it under the broker's "
        "message.max.bytes and the producer's max_request_size, 1 MiB by default)",
    )
    max_output_bytes: int = Field(
        default=262_144,
        ge=1_024,
        description="Largest tool output kept; a longer one ends the call with a clear text",
    )
    dead_letter_value_max_bytes: int = Field(
        default=524_288,
        ge=1_024,
        description="Bytes of a dead-lettered record kept in the letter (base64 makes it 4/3 "
        "bigger); the rest is cut, with the size and sha256 of the original",
    )
    dead_letter_overflow_dir: Path | None = Field(
        default=None,
        description="If set, a dead-lettered record too big for its letter is also written "
        "whole to <dir>/<sha256>.bin",
    )
    max_items_per_response: int = Field(
        default=1_000,
        ge=1,
        description="Most function calls in one model response; a bigger one is dead-lettered",
    )
    max_argument_bytes: int = Field(
        default=262_144,
        ge=1_024,
        description="Largest arguments of one call; a response with bigger ones is dead-lettered",
    )
    max_json_depth: int = Field(
        default=64, ge=4, description="Deepest nesting accepted in a message or arguments"
    )

    traceback_redact_pattern: str | None = Field(
        default=None,
        description="A Python regular expression: what it matches in a tool failure's message "
        "and traceback (kept with the call's attempt, and logged) is taken out (only the text "
        "of its groups when it has groups, so password=secret keeps password=). Unset: the "
        "built-in pattern (kernel.settings.TRACEBACK_REDACT_PATTERN), for password=, token=, "
        "api_key= style values, Authorization headers, sk- API keys, GitHub, Slack and AWS "
        "keys, JWTs and URL passwords; (?!) takes nothing out",
    )

    @field_validator("traceback_redact_pattern")
    @classmethod
    def _compiles(cls, pattern: str | None) -> str | None:
        try:
            re.compile(pattern or TRACEBACK_REDACT_PATTERN)
        except re.error as exc:
            raise ValueError(f"not a regular expression ({exc}); fix or unset it") from exc
        return pattern

    # Recovery: the reconciler's budgets (RecoveryPolicy.of reads them).
    recovery_max_attempts: int = Field(
        default=2,
        ge=1,
        description="Executions of one call in all, the first included (only replay-safe "
        "calls are retried)",
    )
    recovery_probe_budget: int = Field(
        default=4, ge=1, description="Probes of one unknown call before a human task is filed"
    )
    recovery_probe_backoff_s: float = Field(
        default=0.5,
        gt=0,
        description="Delay before the second probe of an unknown call; doubles with each "
        "further probe",
    )
    recovery_report_after_s: float = Field(
        default=30.0,
        ge=0,
        description="How long a turn of a reconcile_then_report tool waits for the verdict on "
        "an unknown call before the model is told its outcome is under review",
    )
    recovery_retry_backoff_s: float = Field(
        default=0.2,
        gt=0,
        description="First backoff step of the fleet's retry of a transient not-executed call "
        "(doubles per attempt, with jitter; an upstream's Retry-After replaces it)",
    )

    # Circuit breaker per tool version (see kernel/stores/circuit.py).
    circuit_window_s: float = Field(
        default=60.0, gt=0, description="Sliding window of a tool version's error rate"
    )
    circuit_min_calls: int = Field(
        default=10,
        ge=1,
        description="Calls of a tool version in the window before its error rate can open "
        "its circuit",
    )
    circuit_error_rate: float = Field(
        default=0.5,
        gt=0,
        le=1,
        description="Share of failed calls in the window that opens a tool version's circuit",
    )
    circuit_cache_s: float = Field(default=1.0, ge=0, description="How long workers cache it")
    circuit_half_open_after_s: float | None = Field(
        default=None, description="Let one call through after this long; None: operator only"
    )
    auto_rollback: bool = Field(
        default=True,
        description="When a tool version's circuit opens and an earlier live version of the "
        "same tool is healthy, the planner routes new calls to that one (kernel/rules/versions.py)",
    )
    registry_cache_s: float = Field(
        default=5.0,
        ge=0,
        description="How long the planner caches the tool registry: newly published "
        "versions and operators' pins (toolfleet tools rollback|pin|unpin) take effect "
        "within this long",
    )
    state_version_refresh_s: float = Field(
        default=10.0,
        gt=0,
        description="How long a service trusts the state version in force it read: the "
        "version `toolfleet migrate --finish` raises takes effect within this long",
    )

    # The live console (toolfleet console).
    trace_url_template: str | None = Field(
        default=None,
        description="Link to a call's trace: a URL with {trace_id} in it, e.g. "
        "http://grafana/explore?traceId={trace_id} (unset: the console shows the id as text)",
    )
    history_retention_s: int | None = Field(
        default=None,
        ge=60,
        description="How long the console's history keeps turns, decisions, tasks and "
        "cancellations (unset: ledger_retention_s, or 7 days when the ledger keeps calls "
        "forever)",
    )
    history_output_max_bytes: int = Field(
        default=1_024,
        ge=0,
        description="How much of each call's output (the text the model saw) the history "
        "keeps; the ledger entry keeps it whole while it lives",
    )
    # Who may use the console (docs/console-access.md). With none of OIDC, tokens or proxy
    # set, `toolfleet console` serves 127.0.0.1 only and prints a login URL for that process.
    console_public_url: str | None = Field(
        default=None,
        description="The URL people reach the console at, e.g. https://console.example; the "
        "OIDC redirect URI is {this}/auth/callback, and https makes the session cookie Secure",
    )
    console_oidc_issuer: str | None = Field(
        default=None,
        description="OpenID Connect issuer URL: turns login through the identity provider on "
        "(authorization code with PKCE; discovery at /.well-known/openid-configuration)",
    )
    console_oidc_client_id: str | None = Field(default=None, description="OIDC client id")
    console_oidc_client_secret: SecretStr | None = Field(
        default=None, description="OIDC client secret (unset: a public client, PKCE only)"
    )
    console_oidc_scopes: str = Field(
        default="openid email profile", description="Scopes the console asks for"
    )
    console_oidc_roles_claim: str = Field(
        default="toolfleet_roles",
        description="Claim with the console roles (viewer, operator, admin); a dotted path "
        "reaches into nested claims, e.g. realm_access.roles",
    )
    console_oidc_tenants_claim: str = Field(
        default="toolfleet_tenants",
        description="Claim listing the tenants a person may see and act for ('*': every tenant)",
    )
    console_session_secret: SecretStr | None = Field(
        default=None, description="Signs the session cookie (at least 32 characters); OIDC needs it"
    )
    console_session_max_age_s: int = Field(
        default=8 * 3600, ge=60, description="How long a console login lasts"
    )
    console_tokens: SecretStr | None = Field(
        default=None,
        description='Static API tokens, JSON: [{"name": "ci-bot", "sha256": "<hex sha256 of the '
        'token>", "role": "viewer|operator|admin", "tenants": ["acme"] or ["*"]}]; callers send '
        "Authorization: Bearer <token>",
    )
    console_proxy_secret: SecretStr | None = Field(
        default=None,
        description="Turns the trusted-proxy mode on: identity headers count only on requests "
        "that carry this secret in console_proxy_secret_header",
    )
    console_proxy_secret_header: str = Field(
        default="X-Toolfleet-Proxy-Secret", description="Header the proxy sends the secret in"
    )
    console_proxy_user_header: str = Field(
        default="X-Forwarded-User", description="Header with the person's name (proxy mode)"
    )
    console_proxy_roles_header: str = Field(
        default="X-Forwarded-Roles", description="Header with their roles, comma separated"
    )
    console_proxy_tenants_header: str = Field(
        default="X-Forwarded-Tenants",
        description="Header with their tenants, comma separated ('*': every tenant)",
    )
    # The MCP front door (toolfleet mcp, docs/mcp.md). It also accepts access tokens of the
    # console's OpenID Connect issuer (console_oidc_*), issued for mcp_public_url.
    mcp_public_url: str | None = Field(
        default=None,
        description="The URL MCP clients reach the door at, e.g. https://mcp.example/mcp: the "
        "audience its OAuth access tokens must be issued for, and the resource its protected-"
        "resource metadata names; its path is where the door serves (unset: /mcp)",
    )
    mcp_tokens: SecretStr | None = Field(
        default=None,
        description="Static bearer tokens of MCP clients, JSON as TOOLFLEET_CONSOLE_TOKENS: "
        '[{"name": "agent-1", "sha256": "<hex sha256 of the token>", "role": '
        '"viewer|operator|admin", "tenants": ["acme"]}]; kept apart from the console\'s, so an '
        "agent's token never opens the console",
    )
    mcp_tenant_header: str = Field(
        default="X-Toolfleet-Tenant",
        description="Header by which a caller whose token names several tenants picks the "
        "one a request is for (it must be one of them)",
    )

    # Local infrastructure (toolfleet infra up).
    infra: str = Field(default="local", description="'local' processes or 'containers'")
    state_dir: Path = Field(
        default_factory=lambda: _xdg("XDG_STATE_HOME", ".local/state"),
        description="Where toolfleet infra keeps Kafka's log dirs, Redis's AOF, pid files and "
        "logs ($XDG_STATE_HOME/toolfleet when that is set)",
    )
    cache_dir: Path = Field(
        default_factory=lambda: _xdg("XDG_CACHE_HOME", ".cache"),
        description="Where toolfleet infra keeps the Kafka jars it resolves from Maven Central "
        "($XDG_CACHE_HOME/toolfleet when that is set)",
    )
    kafka_version: str = Field(default="4.1.1", description="Kafka release toolfleet infra runs")
    kafka_port: int = Field(default=19092, description="Port of the local broker's listener")
    kafka_controller_port: int = Field(
        default=19093, description="Port of the local broker's KRaft controller"
    )
    kafka_heap: str = Field(default="768m", description="Java heap of the local broker")
    redis_port: int = Field(default=16379, description="Port of the local redis-server")
    redis_cluster_masters: int = Field(
        default=0, ge=0, description="Masters of the local Redis Cluster (0: none is run)"
    )
    redis_cluster_replicas: int = Field(default=0, ge=0, description="Replicas of each master")
    redis_cluster_port: int = Field(
        default=17000, description="Port of the local cluster's first node (the others follow)"
    )

    def kafka_servers(self) -> str:
        """The configured bootstrap servers, else the broker ``toolfleet infra up`` runs."""
        return self.kafka_bootstrap_servers or f"127.0.0.1:{self.kafka_port}"

    def redis_address(self) -> str:
        """The configured Redis URL, else the server ``toolfleet infra up`` runs."""
        return self.redis_url or f"redis://127.0.0.1:{self.redis_port}/0"

    def kafka_external(self) -> bool:
        """Whether KAFKA_BOOTSTRAP_SERVERS names a broker other than the one ``toolfleet
        infra up`` runs (its own address, as ``eval "$(toolfleet infra up)"`` exports it, is
        still ours to stop)."""
        local = f"127.0.0.1:{self.kafka_port}"
        return bool(self.kafka_bootstrap_servers) and self.kafka_bootstrap_servers != local

    def redis_external(self) -> bool:
        """Whether REDIS_URL names a server other than the one ``toolfleet infra up`` runs."""
        local = f"redis://127.0.0.1:{self.redis_port}/0"
        return bool(self.redis_url) and self.redis_url != local

    def topic(self, name: str) -> str:
        """The full topic name for a logical topic such as ``outcomes``."""
        return f"{self.topic_prefix}{name}"

    def group(self, name: str) -> str:
        """The full name of a logical consumer group such as ``planner`` (Kafka's group id)."""
        return f"{self.topic_prefix}{name}"

    def partitions_of(self, name: str) -> int:
        """How many partitions logical topic ``name`` is created with."""
        return self.topic_partitions.get(name, self.partitions)

    def replication_of(self, name: str) -> int:
        """The replication factor logical topic ``name`` is created with."""
        return self.topic_replication_factors.get(name, self.replication_factor)
