"""The :class:`Connector` base class: what an integration engineer writes for one API.

A connector is a short class. Class attributes say how to reach the API; two hooks say
what to do::

    class Items(Connector[ItemsConfig]):
        name = "items"
        base_url = "https://api.example.com"

        async def poll(self, ctx, checkpoint):
            page = checkpoint or 1
            while page:
                body = (await ctx.http.get("/items", params={"page": page})).json()
                page = body["next_page"]
                yield Page(body["items"], checkpoint=page)

        async def handle(self, ctx, record):
            ...

Everything else is the runtime's: the schedule, the HTTP client with auth, pacing and
error classification (``ctx.http``), checkpoints stored after each page, per-record
isolation, the dead-letter queue. A connector that polls one feed declares no streams;
several feeds are :class:`Stream` declarations, and the hooks read ``ctx.stream``.

An instance is bound to one tenant: ``self.tenant`` and ``self.config``, the tenant's
config validated by ``config_model`` (inferred from ``Connector[MyConfig]``).

An API whose host depends on the tenant (Shopify shops, Salesforce instances, Zendesk
subdomains, self-hosted GitLab) names its config fields in ``base_url``::

    base_url = "https://{subdomain}.zendesk.com/api/v2"  # a part of the host or path
    base_url = "{instance_url}/services/data/v59.0"      # a whole origin from the config

The tenant's base URL (``self.tenant_base_url``, what ``ctx.http`` is built on) is checked
when the config is validated: a field at the start must be an absolute ``http(s)`` URL, a
field elsewhere a plain name (letters, digits, ``. - _ ~``: it cannot move the host).
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import re
import string
import typing
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, ClassVar, Literal, cast, final

import httpx
from pydantic import BaseModel, ConfigDict, SecretStr, ValidationError
from typing_extensions import TypeVar

from synckit.connectors.auth import AuthFactory, BearerToken, OAuth2
from synckit.connectors.records import Records, describe_record_error
from synckit.connectors.schedule import parse_schedule
from synckit.errors.backoff import RetryPolicy
from synckit.errors.classify import Classification, ClassifyRules, classify
from synckit.errors.error_body import ErrorBody, ErrorDescription
from synckit.errors.exceptions import ConfigurationError
from synckit.errors.pace import PacePolicy
from synckit.errors.waits import DEFAULT_MAX_WAIT

if TYPE_CHECKING:
    from synckit.connectors.context import SyncContext

__all__ = [
    "DEFAULT_STREAM",
    "AuthFactory",
    "BearerToken",
    "CheckpointPolicy",
    "Connector",
    "NoConfig",
    "OAuth2",
    "Page",
    "RateLimit",
    "Records",
    "Stream",
]

#: The name of the one stream of a connector that declares none.
DEFAULT_STREAM = "default"

CheckpointPolicy = Literal["advance", "hold"]

_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_.\-]{0,59}", re.ASCII)


class NoConfig(BaseModel):
    """The config of a connector that needs none: any key given is refused."""

    model_config = ConfigDict(extra="forbid")


ConfigT = TypeVar("ConfigT", bound=BaseModel, default=NoConfig)


@dataclass(frozen=True)
class RateLimit:
    """A client-side limit per tenant: ``per_second`` requests on average, ``burst`` at once.

    Enforced by a token bucket stored in the tenant's ``resources`` row, so it holds
    across every worker process, not just within one.
    """

    per_second: float
    burst: int = 1

    def __post_init__(self) -> None:
        if not (isinstance(self.per_second, int | float) and math.isfinite(self.per_second)):
            raise ConfigurationError(f"RateLimit.per_second must be a number: {self.per_second!r}")
        if self.per_second <= 0:
            raise ConfigurationError("RateLimit.per_second must be positive")
        if not isinstance(self.burst, int) or self.burst < 1:
            raise ConfigurationError("RateLimit.burst must be an integer of at least 1")


@dataclass(frozen=True)
class Stream:
    """One feed of a connector, with its own checkpoint and, optionally, its own schedule.

    ``schedule`` (``every 5m`` or a cron expression) replaces the tenant's schedule for
    this stream. ``policy`` decides what a page with failed records does to the
    checkpoint: ``advance`` (default) moves past them, and they wait in the dead-letter
    queue; ``hold`` keeps the checkpoint of the last fully successful page and ends the
    cycle, so the next cycle reads the failed records again (for APIs sorted by update
    time). ``concurrency`` bounds the records of one page handled at once (default: the
    connector's ``record_concurrency``). ``records`` declares where the stream's records
    land (:class:`~synckit.connectors.records.Records`): validated and merged into that
    table in each page's transaction; ``handle()`` is then optional (for side effects).
    ``webhook_window``: webhook events trigger at most one cycle of the stream per
    window (a flood coalesces; see :mod:`synckit.runtime.sync.webhooks`).
    """

    name: str
    schedule: str | None = None
    policy: CheckpointPolicy = "advance"
    concurrency: int | None = None
    records: Records | None = None
    webhook_window: timedelta = timedelta(seconds=5)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _NAME.fullmatch(self.name):
            raise ConfigurationError(
                f"stream name {self.name!r}: use letters, digits, '_', '.', '-' "
                "(at most 60, starting with a letter)"
            )
        if self.policy not in ("advance", "hold"):
            raise ConfigurationError(
                f"stream {self.name!r}: policy must be 'advance' or 'hold', not {self.policy!r}"
            )
        if self.schedule is not None:
            parse_schedule(self.schedule)
        if self.concurrency is not None and (
            not isinstance(self.concurrency, int) or self.concurrency < 1
        ):
            raise ConfigurationError(f"stream {self.name!r}: concurrency must be at least 1")
        if self.records is not None and not isinstance(self.records, Records):
            raise ConfigurationError(f"stream {self.name!r}: records must be a Records(...)")
        if not isinstance(self.webhook_window, timedelta) or self.webhook_window < timedelta(0):
            raise ConfigurationError(
                f"stream {self.name!r}: webhook_window must be a non-negative timedelta"
            )


@dataclass(frozen=True)
class Page:
    """What ``poll()`` yields: some records, and the checkpoint to store once they are done.

    The checkpoint must be JSON-serialisable; ``None`` leaves the stored one unchanged.

    For a stream whose records sweep (``Records(..., sweep=True)``): ``full_sync`` names
    the full sync the page belongs to (any text that stays the same across its pages,
    e.g. when it began, kept in the checkpoint), and ``sweep=True`` on its last page
    soft-deletes, in that page's transaction, the rows that full sync did not see.
    """

    records: Sequence[Any]
    checkpoint: Any = None
    full_sync: str | None = None
    sweep: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.records, str | bytes) or not isinstance(self.records, Sequence):
            raise TypeError(
                f"Page.records must be a sequence (a list of records), "
                f"not {type(self.records).__name__}"
            )
        if self.full_sync is not None and (
            not isinstance(self.full_sync, str) or not self.full_sync
        ):
            raise TypeError("Page.full_sync must be a non-empty string naming the full sync")
        if self.sweep and self.full_sync is None:
            raise TypeError("Page(sweep=True) needs full_sync: the full sync it completes")


# Methods whose behaviour the runtime relies on; a subclass that redefines one is refused.
_FINAL = ("__init__", "validate_config", "declared_streams", "stream", "polls", "handles")


class Connector(typing.Generic[ConfigT]):
    """Base class of every connector; see the module docstring for the shape of one.

    Class attributes (all optional but ``name``):

    ``name``
        the connector's unique name (used in tenants, jobs, checkpoints, the DLQ).
    ``base_url``
        prefix of relative URLs given to ``ctx.http``; ``{field}`` placeholders are
        filled from the tenant's config (see the module docstring).
    ``auth``
        a declaration the runtime fulfils (:class:`~synckit.connectors.auth.OAuth2`), an
        :class:`httpx.Auth`, or a callable building one from the connector instance
        (e.g. :class:`BearerToken`); override :meth:`build_auth` for more.
    ``rate_limit``
        a :class:`RateLimit` per tenant, enforced before every request.
    ``pace``
        how a rate limit that names no wait paces the tenant
        (:class:`~synckit.errors.PacePolicy`: first wait, growth, cap, provider signals'
        first waits, and the rate learnt when ``rate_limit`` is None); None: the default
        policy (1 s, doubling while refusals continue, up to 15 minutes).
    ``timeout``
        the :class:`httpx.Timeout` of ``ctx.http``.
    ``config_model``
        the pydantic model of a tenant's config (inferred from ``Connector[Model]``).
    ``classify_rules``
        changes to the default error table (:class:`~synckit.errors.ClassifyRules`).
    ``error_body``
        where the API's error bodies keep their message and code, and the class a code
        means (:class:`~synckit.errors.ErrorBody`; the default reads the common shapes);
        override :meth:`describe_error` for a shape no path reaches.
    ``retry_policy``
        the connector's backoff knobs: a failed poll cycle of this connector is retried
        on this :class:`~synckit.errors.RetryPolicy` instead of the worker's (None: the
        worker's).
    ``max_in_flight``
        jobs of one tenant running at once (None: no limit).
    ``streams``
        :class:`Stream` declarations; none means one stream named ``default``.
    ``record_concurrency``
        records of one page handled at once (default 8).
    ``max_inline_wait``
        the longest a request waits inline for pacing (and for a rate-limited answer's
        wait, before it is sent again); a longer wait ends the job with
        :class:`~synckit.errors.exceptions.RateLimited` so the worker defers it instead of sleeping.
    ``max_wait``
        the cap on every wait honoured for this connector, server-given or
        handler-given (default 24 h): a longer one is clamped to it, never discarded.
    """

    name: ClassVar[str] = ""
    base_url: ClassVar[str] = ""
    auth: ClassVar[OAuth2 | AuthFactory | httpx.Auth | None] = None
    rate_limit: ClassVar[RateLimit | None] = None
    pace: ClassVar[PacePolicy | None] = None
    timeout: ClassVar[httpx.Timeout] = httpx.Timeout(30.0, connect=10.0)
    config_model: ClassVar[type[BaseModel]] = NoConfig
    classify_rules: ClassVar[ClassifyRules] = ClassifyRules()
    error_body: ClassVar[ErrorBody] = ErrorBody()
    retry_policy: ClassVar[RetryPolicy | None] = None
    max_in_flight: ClassVar[int | None] = None
    streams: ClassVar[Sequence[Stream]] = ()
    record_concurrency: ClassVar[int] = 8
    max_inline_wait: ClassVar[timedelta] = timedelta(seconds=30)
    max_wait: ClassVar[timedelta] = DEFAULT_MAX_WAIT

    tenant: str
    config: ConfigT
    #: ``base_url`` with the tenant's config filled in: what ``ctx.http`` is built on.
    tenant_base_url: str

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        where = f"connector {cls.__qualname__}"
        for attr in _FINAL:
            if attr in cls.__dict__:
                raise ConfigurationError(
                    f"{where} redefines {attr}(), which the runtime owns (it is @final)"
                )
        if "config_model" not in cls.__dict__:
            inferred = _config_model_from_bases(cls)
            if inferred is not None:
                cls.config_model = inferred
        _check_declaration(cls, where)

    @final
    def __init__(self, tenant: str, config: ConfigT | Mapping[str, Any] | None = None) -> None:
        """Bind the connector to ``tenant``; ``config`` is validated by ``config_model``.

        An invalid config raises :class:`~synckit.errors.exceptions.ConfigurationError` naming the
        fields at fault.
        """
        self.tenant = tenant
        self.config = cast(ConfigT, type(self).validate_config(config, tenant=tenant))
        filled = fill_base_url(type(self).base_url, self.config)
        self.tenant_base_url = type(self).base_url if filled is None else filled

    # --- hooks --------------------------------------------------------------------------

    def poll(self, ctx: SyncContext, checkpoint: Any) -> AsyncIterator[Page]:
        """Yield pages of records from ``checkpoint`` (None on the first cycle).

        Write it as an async generator (``async def`` with ``yield``). Each page's
        checkpoint is stored once the page's records are handled, so a cycle that dies
        reads at most that page again.
        """
        raise NotImplementedError(f"connector {self.name!r} does not poll")

    async def handle(self, ctx: SyncContext, record: Any) -> None:
        """Process one record. Raising fails this record only (it goes to the DLQ).

        Raising :class:`~synckit.errors.exceptions.RateLimited` or
        :class:`~synckit.errors.exceptions.NeedsReauth` (which ``ctx.http`` does for 429 and 401)
        ends the whole cycle instead: the page is read again later.
        """
        raise NotImplementedError(f"connector {self.name!r} does not handle records")

    def classify(
        self, response: httpx.Response | None, exc: BaseException | None, now: datetime
    ) -> Classification:
        """The error class of a failed call; default: the table with ``classify_rules``,
        the error body read by :meth:`describe_error`."""
        return classify(
            response, exc, now=now, rules=self.classify_rules, describe=self.describe_error
        )

    def describe_error(self, status: int, body: object) -> ErrorDescription | None:
        """What a failed response's body says: the provider's message and code (shown,
        redacted, in the exception, the dead letter and the logs) and, optionally, the
        class it means. ``body`` is the parsed JSON, or the text of a body that is not
        JSON. Default: ``self.error_body.describe(status, body)``; return None to add
        nothing. An override that raises counts as None."""
        return self.error_body.describe(status, body)

    def record_id(self, record: Any) -> str:
        """The record's identity in the dead-letter queue; default ``record["id"]``."""
        return str(record["id"])

    def build_auth(self, ctx: SyncContext) -> httpx.Auth | None:
        """The :class:`httpx.Auth` of this tenant's client; default from ``auth``."""
        factory = inspect.getattr_static(self, "auth", None)
        if isinstance(factory, staticmethod | classmethod):
            factory = factory.__get__(self, type(self))
        if factory is None or isinstance(factory, httpx.Auth):
            return factory
        if isinstance(factory, OAuth2):
            # A declaration: the runtime behind the context fulfils it.
            return ctx.auth_for(factory)
        if callable(factory):
            built = factory(self)
            if built is not None and not isinstance(built, httpx.Auth):
                raise ConfigurationError(
                    f"connector {self.name!r}: auth returned {type(built).__name__}, "
                    "not an httpx.Auth"
                )
            return built
        raise ConfigurationError(
            f"connector {self.name!r}: auth must be an httpx.Auth or a callable building one"
        )

    # --- owned by the runtime -----------------------------------------------------------

    @final
    @classmethod
    def validate_config(cls, config: Any, *, tenant: str | None = None) -> BaseModel:
        """``config`` as a ``config_model`` instance, or a one-line ConfigurationError."""
        if isinstance(config, cls.config_model):
            return config
        if config is None:
            config = {}
        if isinstance(config, BaseModel):
            config = config.model_dump()
        whose = (
            f"tenant {tenant!r} (connector {cls.name!r})" if tenant else f"connector {cls.name!r}"
        )
        if not isinstance(config, Mapping):
            raise ConfigurationError(
                f"invalid config for {whose}: expected an object, got {type(config).__name__}"
            )
        try:
            model = cls.config_model.model_validate(dict(config))
        except ValidationError as exc:
            raise ConfigurationError(
                f"invalid config for {whose}: {describe_validation_error(exc)}"
            ) from None
        try:
            fill_base_url(cls.base_url, model)
        except ConfigurationError as exc:
            raise ConfigurationError(f"invalid config for {whose}: {exc}") from None
        return model

    @final
    @classmethod
    def polls(cls) -> bool:
        """Whether the connector defines ``poll()`` (a write-only connector does not)."""
        return cls.poll is not Connector.poll

    @final
    @classmethod
    def declared_streams(cls) -> tuple[Stream, ...]:
        """The streams the runtime polls: the declared ones, else ``default`` if it polls."""
        if cls.streams:
            return tuple(cls.streams)
        return (Stream(DEFAULT_STREAM),) if cls.polls() else ()

    @final
    @classmethod
    def handles(cls) -> bool:
        """Whether the connector defines ``handle()`` (optional for streams with records)."""
        return cls.handle is not Connector.handle

    @final
    @classmethod
    def stream(cls, name: str) -> Stream:
        """The declared stream ``name``; ConfigurationError naming the known ones if absent."""
        for s in cls.declared_streams():
            if s.name == name:
                return s
        known = ", ".join(s.name for s in cls.declared_streams()) or "none"
        raise ConfigurationError(
            f"connector {cls.name!r} has no stream {name!r} (streams: {known})"
        )

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r} tenant={self.tenant!r}>"


def describe_validation_error(exc: ValidationError) -> str:
    """One line naming every field at fault: ``api_token: Field required; page_size: ...``."""
    return describe_record_error(exc, whole="(config)")


_NAME_VALUE = re.compile(r"[A-Za-z0-9._~-]+", re.ASCII)


def base_url_fields(template: str) -> tuple[str, ...]:
    """The config fields a ``base_url`` names (``{field}``), in order; none for a plain URL.

    Raises :class:`ConfigurationError` for a template that is not one (an unclosed
    brace, a format spec, an attribute or index).
    """
    if "{" not in template and "}" not in template:
        return ()
    try:
        parts = list(string.Formatter().parse(template))
    except ValueError as exc:
        raise ConfigurationError(f"base_url {template!r} is not a template: {exc}") from None
    names = []
    for _, name, spec, conversion in parts:
        if name is None:
            continue
        if not name.isidentifier() or spec or conversion:
            raise ConfigurationError(
                f"base_url {template!r}: a placeholder is a config field's name, "
                f"like {{subdomain}}, not {{{name}{'!' + conversion if conversion else ''}"
                f"{':' + spec if spec else ''}}}"
            )
        names.append(name)
    return tuple(names)


def fill_base_url(template: str, config: BaseModel) -> str | None:
    """``template`` filled from ``config``, checked (None: a plain ``base_url``, unchanged).

    A field at the start of the template holds a whole origin (an absolute ``http(s)``
    URL; a trailing ``/`` is dropped); a field anywhere else a plain name, which cannot
    change the host the template names. Raises a one-line :class:`ConfigurationError`
    starting with the field at fault.
    """
    if not base_url_fields(template):
        return None
    out = []
    for literal, name, _, _ in string.Formatter().parse(template):
        out.append(literal)
        if name is None:
            continue
        raw = getattr(config, name, None)
        if isinstance(raw, SecretStr):
            raw = raw.get_secret_value()
        if raw is None or isinstance(raw, bool | dict | list):
            raise ConfigurationError(f"{name}: needed for base_url {template!r}")
        value = str(raw).strip()
        if not out[:-1] and not literal:
            value = value.rstrip("/")
            problem = _origin_problem(value)
            if problem:
                raise ConfigurationError(f"{name}: {problem}: {value[:100]!r}")
        elif not _NAME_VALUE.fullmatch(value) or set(value) == {"."}:
            raise ConfigurationError(
                f"{name}: {value[:100]!r} cannot be placed in base_url {template!r} "
                "(letters, digits, '.', '-', '_', '~' only)"
            )
        out.append(value)
    url = "".join(out)
    problem = _origin_problem(url)
    if problem:
        raise ConfigurationError(f"base_url {template!r} filled in: {problem}: {url[:100]!r}")
    return url


def _origin_problem(value: str) -> str | None:
    """Why ``value`` is not an absolute http(s) URL fit to be a base URL (None: it is)."""
    try:
        url = httpx.URL(value)
    except (httpx.InvalidURL, ValueError, TypeError):
        return "not a URL"
    if url.scheme not in ("http", "https") or not url.host:
        return "not an absolute http(s) URL"
    if url.userinfo or url.query or url.fragment:
        return "a base URL has no user, query or fragment"
    return None


def _config_model_from_bases(cls: type) -> type[BaseModel] | None:
    for base in getattr(cls, "__orig_bases__", ()):
        origin = typing.get_origin(base)
        if isinstance(origin, type) and issubclass(origin, Connector):
            args = typing.get_args(base)
            if args and isinstance(args[0], type) and issubclass(args[0], BaseModel):
                return args[0]
    return None


def pace_policy_of(cls: type[Connector[Any]]) -> PacePolicy:
    """The pace policy the runtime applies to ``cls``'s tenants: its ``pace`` (or the
    default policy), every wait within the connector's ``max_wait``."""
    policy = cls.pace if cls.pace is not None else PacePolicy()
    if policy.max_wait <= cls.max_wait:
        return policy
    return dataclasses.replace(policy, max_wait=cls.max_wait)


def _check_declaration(cls: type[Connector[Any]], where: str) -> None:
    """Refuse a connector class that cannot work, when it is defined rather than polled."""
    if cls.name and (not isinstance(cls.name, str) or not _NAME.fullmatch(cls.name)):
        raise ConfigurationError(
            f"{where}: name {cls.name!r}: use letters, digits, '_', '.', '-' "
            "(at most 60, starting with a letter)"
        )
    if not isinstance(cls.base_url, str):
        raise ConfigurationError(f"{where}: base_url must be a string")
    try:
        fields = base_url_fields(cls.base_url)
    except ConfigurationError as exc:
        raise ConfigurationError(f"{where}: {exc}") from None
    known = getattr(cls.config_model, "model_fields", {})
    missing = [f for f in fields if f not in known]
    if missing and isinstance(cls.config_model, type) and issubclass(cls.config_model, BaseModel):
        raise ConfigurationError(
            f"{where}: base_url names {', '.join(missing)}, which its config_model "
            f"{cls.config_model.__name__} does not have"
        )
    if not (isinstance(cls.config_model, type) and issubclass(cls.config_model, BaseModel)):
        raise ConfigurationError(f"{where}: config_model must be a pydantic BaseModel subclass")
    if cls.rate_limit is not None and not isinstance(cls.rate_limit, RateLimit):
        raise ConfigurationError(f"{where}: rate_limit must be a RateLimit or None")
    if cls.pace is not None and not isinstance(cls.pace, PacePolicy):
        raise ConfigurationError(f"{where}: pace must be a PacePolicy or None")
    if not isinstance(cls.classify_rules, ClassifyRules):
        raise ConfigurationError(f"{where}: classify_rules must be a ClassifyRules")
    if not isinstance(cls.error_body, ErrorBody):
        raise ConfigurationError(f"{where}: error_body must be an ErrorBody")
    if cls.retry_policy is not None and not isinstance(cls.retry_policy, RetryPolicy):
        raise ConfigurationError(f"{where}: retry_policy must be a RetryPolicy or None")
    if cls.max_in_flight is not None and (
        not isinstance(cls.max_in_flight, int) or cls.max_in_flight < 1
    ):
        raise ConfigurationError(f"{where}: max_in_flight must be at least 1 (or None)")
    if not isinstance(cls.record_concurrency, int) or cls.record_concurrency < 1:
        raise ConfigurationError(f"{where}: record_concurrency must be at least 1")
    if not isinstance(cls.max_inline_wait, timedelta) or cls.max_inline_wait < timedelta(0):
        raise ConfigurationError(f"{where}: max_inline_wait must be a non-negative timedelta")
    if not isinstance(cls.max_wait, timedelta) or cls.max_wait <= timedelta(0):
        raise ConfigurationError(f"{where}: max_wait must be a positive timedelta")
    if isinstance(cls.streams, str | Stream) or not isinstance(cls.streams, Sequence):
        raise ConfigurationError(f"{where}: streams must be a list of Stream")
    seen: set[str] = set()
    for s in cls.streams:
        if not isinstance(s, Stream):
            raise ConfigurationError(f"{where}: streams must be Stream objects, not {s!r}")
        if s.name in seen:
            raise ConfigurationError(f"{where}: stream {s.name!r} is declared twice")
        seen.add(s.name)
    if cls.streams and not cls.polls():
        raise ConfigurationError(f"{where}: declares streams but defines no poll()")
    if cls.polls() and cls.handle is Connector.handle:
        bare = [s.name for s in cls.declared_streams() if s.records is None]
        if bare:
            raise ConfigurationError(
                f"{where}: defines poll() but no handle(), and stream {bare[0]!r} declares "
                "no records"
            )
    tables: dict[str, str] = {}
    for s in cls.streams:
        for r in s.records.tables() if s.records is not None else ():
            if r.table in tables:
                raise ConfigurationError(
                    f"{where}: records table {r.table!r} is declared by streams "
                    f"{tables[r.table]!r} and {s.name!r}"
                )
            tables[r.table] = s.name
    if cls.polls() and not (
        inspect.isasyncgenfunction(cls.poll) or not inspect.iscoroutinefunction(cls.poll)
    ):
        raise ConfigurationError(
            f"{where}: poll() must be an async generator (async def with yield), "
            "not a coroutine that returns"
        )
    if cls.handle is not Connector.handle and not inspect.iscoroutinefunction(cls.handle):
        raise ConfigurationError(f"{where}: handle() must be an async def")
