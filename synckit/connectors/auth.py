"""Auth *declarations*: what a connector says about how its API authenticates.

A connector declares its auth as a class attribute; the runtime fulfils it when it opens
a tenant's ``ctx.http``::

    class Api(Connector[ApiConfig]):
        auth = BearerToken("api_token")          # a token in the tenant's config

    class Graph(Connector[GraphConfig]):
        auth = OAuth2(lambda c: OAuth2Config(    # tokens the runtime keeps and refreshes
            token_url=c.config.token_endpoint,
            client_id=c.config.client_id,
            client_secret=c.config.client_secret.get_secret_value(),
        ))

These are plain values: nothing here touches the database or the network. An
:class:`OAuth2` declaration is fulfilled by :class:`synckit.runtime.credentials.oauth.OAuth2Auth`
(token sets sealed in the tenant's ``connections`` row, refreshed single-flight across
processes), through the context's :meth:`~synckit.connectors.context.SyncContext.auth_for`.
"""

from __future__ import annotations

import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Literal

import httpx

from synckit.errors.exceptions import ConfigurationError

if TYPE_CHECKING:
    from synckit.connectors.base import Connector

__all__ = [
    "AuthFactory",
    "BearerToken",
    "ClientAuthMethod",
    "GrantType",
    "OAuth2",
    "OAuth2Config",
]

GrantType = Literal["refresh_token", "client_credentials"]
ClientAuthMethod = Literal["client_secret_basic", "client_secret_post", "none"]
_AUTH_METHODS = ("client_secret_basic", "client_secret_post", "none")


@dataclass(frozen=True)
class OAuth2Config:
    """How to get tokens for one connector's API (the same for all its tenants).

    ``grant`` is ``refresh_token`` (tenants authorised once, then refreshed) or
    ``client_credentials`` (the client's own credentials, no user). ``auth_method`` is how
    the client authenticates at the token endpoint: ``client_secret_basic`` and
    ``client_secret_post`` need ``client_secret``; ``none`` (a public client, which proves
    itself with PKCE in the connect flow) must have none. ``authorize_url`` is the
    provider's consent page, needed only by the connect flow
    (:mod:`synckit.runtime.credentials.authorize`). A contradictory config raises
    :class:`~synckit.errors.exceptions.ConfigurationError`.
    """

    token_url: str
    client_id: str
    client_secret: str | None = field(default=None, repr=False)
    grant: GrantType = "refresh_token"
    auth_method: ClientAuthMethod = "client_secret_basic"
    scope: str | None = None
    #: The most a token is refreshed ahead of its expiry (short-lived tokens: a quarter
    #: of their lifetime, see :func:`refresh_margin`).
    leeway: timedelta = timedelta(seconds=60)
    #: Bound on one token request, all of it.
    timeout: float = 10.0
    authorize_url: str | None = None

    def __post_init__(self) -> None:
        if self.grant not in ("refresh_token", "client_credentials"):
            raise ConfigurationError(f"unsupported grant {self.grant!r}")
        if self.auth_method not in _AUTH_METHODS:
            raise ConfigurationError(
                f"unsupported client auth method {self.auth_method!r} "
                f"(use one of {', '.join(_AUTH_METHODS)})"
            )
        if self.auth_method == "none":
            if self.client_secret:
                raise ConfigurationError(
                    "auth_method 'none' is for public clients: give no client_secret "
                    "(or choose client_secret_basic / client_secret_post)"
                )
            if self.grant == "client_credentials":
                raise ConfigurationError(
                    "the client_credentials grant needs client authentication, not 'none'"
                )
        elif not self.client_secret:
            raise ConfigurationError(
                f"auth_method {self.auth_method!r} needs a client_secret; a public client "
                "says auth_method='none'"
            )
        if self.timeout <= 0:
            raise ConfigurationError("timeout must be positive")

    @property
    def lease_time(self) -> timedelta:
        """How long a refresher holds the lease: past any bounded provider call."""
        return timedelta(seconds=2 * self.timeout + 5)


class OAuth2:
    """``auth = OAuth2(...)``: the API takes OAuth2 bearer tokens, which the runtime keeps.

    Give the :class:`OAuth2Config` (the same for every tenant), its fields, or a function
    of the connector instance that builds it (for values in the tenant's config)::

        auth = OAuth2(token_url="https://idp/token", client_id="id", client_secret="s")
        auth = OAuth2(lambda c: OAuth2Config(token_url=c.config.token_url, ...))

    Fields given directly are validated when the class is defined. The runtime attaches
    the tenant's token to every request of ``ctx.http``, refreshing it single-flight
    across processes (:class:`synckit.runtime.credentials.oauth.OAuth2Auth`); the first tokens come
    from the connect flow (``synckit tenants connect``).
    """

    __slots__ = ("_config",)

    def __init__(
        self,
        config: OAuth2Config | Callable[[Connector[Any]], OAuth2Config] | None = None,
        /,
        **fields: Any,
    ) -> None:
        if config is None:
            config = OAuth2Config(**fields)
        elif fields:
            raise ConfigurationError(
                "OAuth2: give an OAuth2Config (or a function building one) or its fields, not both"
            )
        elif not (isinstance(config, OAuth2Config) or callable(config)):
            raise ConfigurationError(
                f"OAuth2: expected an OAuth2Config or a function building one, "
                f"not {type(config).__name__}"
            )
        self._config = config

    def __repr__(self) -> str:
        if isinstance(self._config, OAuth2Config):
            return f"OAuth2(token_url={self._config.token_url!r})"
        return "OAuth2(<per tenant>)"

    def config_for(self, connector: Connector[Any]) -> OAuth2Config:
        """The :class:`OAuth2Config` of ``connector``'s tenant."""
        config = self._config
        if not isinstance(config, OAuth2Config):
            config = config(connector)
            if not isinstance(config, OAuth2Config):
                raise ConfigurationError(
                    f"connector {connector.name!r}: its OAuth2 declaration built "
                    f"{type(config).__name__}, not an OAuth2Config"
                )
        return config


class BearerToken:
    """An ``auth`` factory: ``Authorization: Bearer <config.<field>>`` on every request.

    >>> class Api(Connector[ApiConfig]):
    ...     auth = BearerToken("api_token")
    """

    def __init__(self, field: str = "api_token") -> None:
        self.field = field

    def __call__(self, connector: Connector[Any]) -> httpx.Auth:
        value = getattr(connector.config, self.field, None)
        secret = getattr(value, "get_secret_value", None)
        token = secret() if callable(secret) else value
        if not isinstance(token, str) or not token:
            raise ConfigurationError(
                f"connector {connector.name!r}: config field {self.field!r} holds no token"
            )
        return _Bearer(token)


class _Bearer(httpx.Auth):
    def __init__(self, token: str) -> None:
        self._header = f"Bearer {token}"

    def auth_flow(self, request: httpx.Request) -> typing.Generator[httpx.Request, Any, None]:
        request.headers["Authorization"] = self._header
        yield request


class AuthFactory(typing.Protocol):
    """``auth``: a callable that builds the :class:`httpx.Auth` of a connector instance.

    A Protocol rather than a ``Callable`` alias: mypy takes a ``Callable`` class
    attribute for a method and refuses ``auth = BearerToken("api_token")`` in a subclass.
    """

    def __call__(self, connector: Connector[Any], /) -> httpx.Auth: ...
