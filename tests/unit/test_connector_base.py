"""The Connector surface: declaration, typed config, final methods, streams, auth (no I/O)."""

from __future__ import annotations

import typing
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest
from pydantic import BaseModel, SecretStr

from synckit import Connector, Page, RateLimit, Stream, SyncContext
from synckit.connectors.base import _FINAL, DEFAULT_STREAM, BearerToken, NoConfig
from synckit.errors import ClassifyRules, ErrorClass
from synckit.errors.exceptions import ConfigurationError

NOW = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)


class Items(Connector):
    """The whole of a paged REST connector: a name, a base URL, poll and handle."""

    name = "items"
    base_url = "https://api.example.com"

    async def poll(self, ctx: SyncContext, checkpoint: Any) -> AsyncIterator[Page]:
        page = checkpoint or 1
        while page:
            body = (await ctx.http.get("/items", params={"page": page})).json()
            page = body["next"]
            yield Page(body["items"], checkpoint=page)

    async def handle(self, ctx: SyncContext, record: Any) -> None:
        return None


class MailConfig(BaseModel):
    mailbox: str
    api_token: SecretStr
    page_size: int = 50


class Mail(Connector[MailConfig]):
    name = "mail"
    streams = (Stream("messages"), Stream("contacts", schedule="every 1h", policy="hold"))

    async def poll(self, ctx: SyncContext, checkpoint: Any) -> AsyncIterator[Page]:
        yield Page([], checkpoint=None)

    async def handle(self, ctx: SyncContext, record: Any) -> None:
        return None


def test_short_paged_connector_is_valid() -> None:
    """name, base_url, poll and handle are enough: one default stream, no config."""
    assert Items.polls()
    assert [s.name for s in Items.declared_streams()] == [DEFAULT_STREAM]
    assert Items.config_model is NoConfig
    c = Items("acme")
    assert c.tenant == "acme" and isinstance(c.config, NoConfig)
    assert c.record_id({"id": 42}) == "42"
    assert Items.rate_limit is None and Items.max_in_flight is None


def test_config_model_is_inferred_and_typed() -> None:
    """Connector[Model] sets config_model; an instance's config is a Model."""
    assert Mail.config_model is MailConfig
    c = Mail("acme", {"mailbox": "inbox", "api_token": "s3cret"})
    assert isinstance(c.config, MailConfig)
    assert c.config.page_size == 50
    assert c.config.api_token.get_secret_value() == "s3cret"


def test_invalid_config_names_the_fields_in_one_line() -> None:
    """A missing field and a wrong type are both named, on one line, with the tenant."""
    with pytest.raises(ConfigurationError) as info:
        Mail("acme", {"api_token": "x", "page_size": "lots"})
    message = str(info.value)
    assert "\n" not in message
    assert "tenant 'acme'" in message and "connector 'mail'" in message
    assert "mailbox: Field required" in message
    assert "page_size:" in message


def test_connector_without_config_refuses_keys() -> None:
    """NoConfig refuses any key, so a typo is not silently ignored."""
    with pytest.raises(ConfigurationError, match="api_tokn"):
        Items("acme", {"api_tokn": "x"})


def test_config_must_be_an_object() -> None:
    with pytest.raises(ConfigurationError, match="expected an object"):
        Mail("acme", ["not", "a", "dict"])  # type: ignore[arg-type]


@pytest.mark.parametrize("method", _FINAL)
def test_runtime_owned_methods_are_final(method: str) -> None:
    """Methods the runtime owns are @final and a subclass redefining one is refused."""
    assert getattr(Connector.__dict__[method], "__final__", False) is True
    with pytest.raises(ConfigurationError, match=f"redefines {method}"):
        type("Bad", (Items,), {method: lambda self, *a, **k: None})


def test_hooks_are_overridable_not_final() -> None:
    for hook in ("poll", "handle", "classify", "record_id", "build_auth"):
        assert not getattr(getattr(Connector, hook), "__final__", False)


def test_streams_are_declared_with_their_own_schedule_and_policy() -> None:
    """Several streams: each its name, schedule and checkpoint policy."""
    assert [s.name for s in Mail.declared_streams()] == ["messages", "contacts"]
    assert Mail.stream("contacts").policy == "hold"
    assert Mail.stream("contacts").schedule == "every 1h"
    known = r"no stream 'nope' \(streams: messages, contacts\)"
    with pytest.raises(ConfigurationError, match=known):
        Mail.stream("nope")


def test_write_only_connector_has_no_streams() -> None:
    class Writer(Connector):
        name = "writer"

    assert not Writer.polls() and Writer.declared_streams() == ()


@pytest.mark.parametrize(
    ("attrs", "message"),
    [
        ({"name": "bad name"}, "name 'bad name'"),
        ({"streams": (Stream("a"), Stream("a"))}, "declared twice"),
        ({"streams": Stream("a")}, "list of Stream"),
        ({"rate_limit": 5}, "rate_limit must be a RateLimit"),
        ({"pace": 1.0}, "pace must be a PacePolicy"),
        ({"record_concurrency": 0}, "record_concurrency"),
        ({"max_in_flight": 0}, "max_in_flight"),
        ({"config_model": dict}, "config_model"),
    ],
)
def test_declaration_errors_are_caught_at_class_creation(
    attrs: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigurationError, match=message):
        type("Bad", (Items,), attrs)


def test_poll_without_handle_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="no handle"):

        class OnlyPoll(Connector):
            name = "only_poll"

            async def poll(self, ctx: SyncContext, checkpoint: Any) -> AsyncIterator[Page]:
                yield Page([])


def test_poll_that_returns_instead_of_yielding_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="async generator"):

        class Returns(Connector):
            name = "returns"

            async def poll(self, ctx: SyncContext, checkpoint: Any) -> Any:  # type: ignore[override]
                return [Page([])]

            async def handle(self, ctx: SyncContext, record: Any) -> None:
                return None


def test_stream_and_rate_limit_validation() -> None:
    with pytest.raises(ConfigurationError, match="policy"):
        Stream("s", policy="skip")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="schedule"):
        Stream("s", schedule="sometimes")
    with pytest.raises(ConfigurationError, match="stream name"):
        Stream("a:b")
    with pytest.raises(ConfigurationError, match="positive"):
        RateLimit(0)
    with pytest.raises(ConfigurationError, match="burst"):
        RateLimit(1, burst=0)


def test_page_records_must_be_a_sequence() -> None:
    assert Page([{"id": 1}], checkpoint={"page": 2}).records == [{"id": 1}]
    with pytest.raises(TypeError, match="sequence"):
        Page(iter([{"id": 1}]))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="sequence"):
        Page("abc")


def test_default_classify_applies_the_connectors_rules() -> None:
    """classify() defaults to the errors table with the connector's classify_rules."""

    class Strict(Items):
        classify_rules = ClassifyRules(by_status={404: ErrorClass.CONFLICT})

    response = httpx.Response(404, request=httpx.Request("GET", "https://x/y"))
    assert Items("t").classify(response, None, NOW).error_class is ErrorClass.NOT_FOUND
    assert Strict("t").classify(response, None, NOW).error_class is ErrorClass.CONFLICT


def _ctx() -> Any:
    return typing.cast(SyncContext, None)


def test_auth_defaults_to_none_and_accepts_factories() -> None:
    """auth may be None, an httpx.Auth, a function of the connector, or BearerToken."""
    assert Items("t").build_auth(_ctx()) is None

    basic = httpx.BasicAuth("u", "p")

    class Shared(Items):
        auth = basic

    assert Shared("t").build_auth(_ctx()) is basic

    def per_tenant(connector: Connector[Any]) -> httpx.Auth:
        return httpx.BasicAuth(connector.tenant, "pw")

    class PerTenant(Items):
        auth = per_tenant

    built = PerTenant("acme").build_auth(_ctx())
    assert isinstance(built, httpx.BasicAuth)

    class Bearer(Mail):
        auth = BearerToken("api_token")

    bearer = Bearer("acme", {"mailbox": "m", "api_token": "tok"}).build_auth(_ctx())
    assert bearer is not None
    request = next(bearer.sync_auth_flow(httpx.Request("GET", "https://x")))
    assert request.headers["Authorization"] == "Bearer tok"


class _Fulfils:
    """A context that records the auth declarations handed to it (the runtime's part)."""

    def __init__(self) -> None:
        self.asked: list[tuple[Any, Any]] = []
        self.auth = httpx.BasicAuth("runtime", "made")

    def auth_for(self, declaration: Any) -> httpx.Auth:
        self.asked.append((declaration, declaration.config_for(self.connector)))
        return self.auth

    connector: Any = None


def test_an_oauth2_declaration_is_fulfilled_by_the_context() -> None:
    """auth = OAuth2(...) is a plain value; build_auth hands it to ctx.auth_for, which
    builds the httpx.Auth with the config of this tenant's connector."""
    from synckit.connectors.auth import OAuth2, OAuth2Config

    fixed = OAuth2(token_url="https://idp/token", client_id="id", client_secret="s")

    class Fixed(Items):
        auth = fixed

    ctx = _Fulfils()
    ctx.connector = Fixed("acme")
    assert Fixed("acme").build_auth(typing.cast(SyncContext, ctx)) is ctx.auth
    [(declaration, config)] = ctx.asked
    assert declaration is fixed
    assert config == OAuth2Config(token_url="https://idp/token", client_id="id", client_secret="s")

    class PerTenant(Mail):
        auth = OAuth2(
            lambda c: OAuth2Config(
                token_url=f"https://idp/{c.config.mailbox}/token", client_id=c.tenant,
                auth_method="none",
            )
        )  # fmt: skip

    ctx = _Fulfils()
    ctx.connector = PerTenant("acme", {"mailbox": "box", "api_token": "t"})
    assert ctx.connector.build_auth(typing.cast(SyncContext, ctx)) is ctx.auth
    [(_, config)] = ctx.asked
    assert (config.token_url, config.client_id) == ("https://idp/box/token", "acme")


def test_an_oauth2_declaration_is_checked_when_written() -> None:
    from synckit.connectors.auth import OAuth2, OAuth2Config

    with pytest.raises(ConfigurationError, match="needs a client_secret"):
        OAuth2(token_url="https://idp/token", client_id="id")
    with pytest.raises(ConfigurationError, match="not both"):
        OAuth2(OAuth2Config("https://idp/token", "id", "s"), client_id="other")
    with pytest.raises(ConfigurationError, match="expected an OAuth2Config"):
        OAuth2("https://idp/token")  # type: ignore[arg-type]
    bad = OAuth2(lambda c: "https://idp/token")  # type: ignore[arg-type,return-value]
    with pytest.raises(ConfigurationError, match="not an OAuth2Config"):
        bad.config_for(Items("t"))


def test_a_records_log_is_bound_to_its_record_when_used() -> None:
    import structlog
    from structlog.testing import capture_logs

    from synckit.runtime.sync.context import RuntimeContext

    base = structlog.get_logger("t").bind(tenant="acme")
    ctx = RuntimeContext(
        db=None,  # type: ignore[arg-type]
        connector=None,  # type: ignore[arg-type]
        tenant="acme",
        stream="default",
        resource_key="k",
        trace_id="tr",
        log=base,
        http=None,  # type: ignore[arg-type]
    )
    one, two = ctx.for_record("r1"), ctx.for_record("r2")
    with capture_logs() as logs:
        one.log.info("handled", n=1)
        two.log.warning("odd")
        one.log.bind(extra=True).info("again")
    assert [(e["event"], e.get("record_id"), e.get("tenant")) for e in logs] == [
        ("handled", "r1", "acme"),
        ("odd", "r2", "acme"),
        ("again", "r1", "acme"),
    ]
    assert ctx.log is base


def test_a_connectors_pace_is_held_to_its_max_wait() -> None:
    """pace_policy_of: the declared PacePolicy (or the default), every wait within the
    connector's max_wait."""
    from datetime import timedelta

    from synckit import PacePolicy
    from synckit.connectors.base import pace_policy_of

    short = type("Short", (Items,), {"max_wait": timedelta(minutes=5)})
    assert pace_policy_of(short).max_wait == timedelta(minutes=5)
    assert pace_policy_of(short).first == timedelta(seconds=1)
    own = type("Own", (Items,), {"pace": PacePolicy(first=3.0, cap=60)})
    assert pace_policy_of(own) == PacePolicy(first=3.0, cap=60)
