"""How every Kafka and Redis connection of a process is secured: one home for the options.

Every aiokafka client (producers, consumers, the admin client) is built with
``kafka_options(settings)``: the security protocol, SASL (PLAIN, SCRAM-SHA-256/512,
OAUTHBEARER) and TLS (a CA, a client certificate, hostname verification) from the settings.
Redis takes TLS from a ``rediss://`` URL and ``redis_tls_options(settings)`` (a CA, a client
certificate), and an ACL user from the URL's user info (``rediss://user:password@host/0``).

``explain_connection_error`` turns what the client libraries raise when a connection is refused
into a ToolfleetError that says which connection failed, why, and which setting to look at.
"""

from __future__ import annotations

import importlib
import ssl
from typing import TYPE_CHECKING, Any

from kernel.errors import ConfigurationError, InfrastructureError

if TYPE_CHECKING:
    from kernel.settings import Settings


def kafka_options(settings: Settings) -> dict[str, Any]:
    """The keyword arguments every aiokafka client of this process takes, for its broker."""
    options: dict[str, Any] = {
        "bootstrap_servers": settings.kafka_servers(),
        "security_protocol": settings.kafka_security_protocol,
    }
    protocol = settings.kafka_security_protocol
    if protocol in ("SSL", "SASL_SSL"):
        options["ssl_context"] = _kafka_ssl_context(settings)
    if protocol in ("SASL_PLAINTEXT", "SASL_SSL"):
        mechanism = settings.kafka_sasl_mechanism
        options["sasl_mechanism"] = mechanism
        if mechanism == "OAUTHBEARER":
            options["sasl_oauth_token_provider"] = _token_provider(settings)
        else:
            if settings.kafka_sasl_username is None or settings.kafka_sasl_password is None:
                raise ConfigurationError(
                    f"Kafka SASL {mechanism} needs TOOLFLEET_KAFKA_SASL_USERNAME and "
                    "TOOLFLEET_KAFKA_SASL_PASSWORD"
                )
            options["sasl_plain_username"] = settings.kafka_sasl_username
            options["sasl_plain_password"] = settings.kafka_sasl_password.get_secret_value()
    return options


def _kafka_ssl_context(settings: Settings) -> ssl.SSLContext:
    context = ssl.create_default_context(
        cafile=str(settings.kafka_ssl_cafile) if settings.kafka_ssl_cafile else None
    )
    if settings.kafka_ssl_certfile is not None:
        password = settings.kafka_ssl_key_password
        context.load_cert_chain(
            str(settings.kafka_ssl_certfile),
            str(settings.kafka_ssl_keyfile) if settings.kafka_ssl_keyfile else None,
            password.get_secret_value() if password is not None else None,
        )
    context.check_hostname = settings.kafka_ssl_check_hostname
    if not settings.kafka_ssl_check_hostname:
        # Hostname checks off still verifies the chain against the CA.
        context.verify_mode = ssl.CERT_REQUIRED
    return context


def _token_provider(settings: Settings) -> Any:
    """The OAUTHBEARER token provider named ``module:attribute`` (an aiokafka
    ``AbstractTokenProvider`` instance, or a class or factory that makes one)."""
    path = settings.kafka_sasl_oauth_token_provider
    if not path or ":" not in path:
        raise ConfigurationError(
            "Kafka SASL OAUTHBEARER needs TOOLFLEET_KAFKA_SASL_OAUTH_TOKEN_PROVIDER, "
            "'module:attribute' naming an aiokafka AbstractTokenProvider"
        )
    module, _, name = path.partition(":")
    found = getattr(importlib.import_module(module), name)
    from aiokafka.abc import AbstractTokenProvider

    provider = found if isinstance(found, AbstractTokenProvider) else found()
    if not isinstance(provider, AbstractTokenProvider):
        raise ConfigurationError(f"{path} is not an aiokafka AbstractTokenProvider")
    return provider


def redis_tls_options(settings: Settings) -> dict[str, Any]:
    """redis-py connection keyword arguments for TLS (``rediss://``): CA and client cert."""
    options: dict[str, Any] = {}
    if settings.redis_tls_ca_certs is not None:
        options["ssl_ca_certs"] = str(settings.redis_tls_ca_certs)
    if settings.redis_tls_certfile is not None:
        options["ssl_certfile"] = str(settings.redis_tls_certfile)
        if settings.redis_tls_keyfile is not None:
            options["ssl_keyfile"] = str(settings.redis_tls_keyfile)
    if options:
        options["ssl_cert_reqs"] = "required"
    return options


_REFUSED_NAMES = frozenset(
    {
        "SaslAuthenticationFailed",  # aiokafka: wrong SASL credentials or mechanism
        "AuthenticationError",  # redis-py: wrong ACL user or password
        "AuthenticationWrongNumberOfArgsError",
        "SSLCertVerificationError",  # the server's certificate is not trusted or not its name
    }
)


def refused(exc: BaseException) -> bool:
    """Whether Kafka or Redis refused this process: credentials or TLS, which waiting does not
    fix (an outage does; the services wait for that instead)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if type(current).__name__ in _REFUSED_NAMES or "WRONGPASS" in str(current):
            return True
        current = current.__cause__ or current.__context__
    return False


def explain_connection_error(exc: BaseException, settings: Settings) -> InfrastructureError:
    """What to tell an operator when Kafka or Redis refused this process's connection."""
    cause = _refusal(exc)
    name = type(cause).__name__
    text = str(cause) or name
    if name in ("SaslAuthenticationFailed", "AuthenticationError") or "WRONGPASS" in text:
        if name == "SaslAuthenticationFailed":
            return InfrastructureError(
                f"Kafka at {settings.kafka_servers()} refused SASL "
                f"{settings.kafka_sasl_mechanism} authentication as "
                f"{settings.kafka_sasl_username!r}: {text}; check "
                "TOOLFLEET_KAFKA_SASL_USERNAME / TOOLFLEET_KAFKA_SASL_PASSWORD"
            )
        return InfrastructureError(
            f"Redis refused the credentials of REDIS_URL ({redact_url(settings.redis_address())}): "
            f"{text}; check the user and password in REDIS_URL (an ACL user: "
            "rediss://user:password@host:port/0)"
        )
    if isinstance(cause, ssl.SSLError):
        return InfrastructureError(
            f"TLS to Kafka ({settings.kafka_servers()}) or Redis failed: {text}; check the CA "
            "(TOOLFLEET_KAFKA_SSL_CAFILE, TOOLFLEET_REDIS_TLS_CA_CERTS) and that the server's "
            "certificate names the host you connect to"
        )
    return InfrastructureError(f"cannot connect: {name}: {text}")


def _refusal(exc: BaseException) -> BaseException:
    """The exception in ``exc``'s chain that says what was refused."""
    current: BaseException | None = exc
    while current is not None:
        if type(current).__name__ in _REFUSED_NAMES or "WRONGPASS" in str(current):
            return current
        current = current.__cause__ or current.__context__
    return exc


def redact_url(url: str) -> str:
    """``url`` with the password of its user info hidden (``redis://user:***@host:6379/0``),
    for log lines and messages."""
    scheme, sep, rest = url.partition("://")
    if "@" not in rest:
        return url
    credentials, _, host = rest.rpartition("@")
    user = credentials.split(":", 1)[0]
    return f"{scheme}{sep}{user}:***@{host}"
