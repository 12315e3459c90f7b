"""``ctx.http`` behind a proxy and over TLS, against real servers on loopback: the
environment's ``HTTP_PROXY`` / ``HTTPS_PROXY`` and ``NO_PROXY``, an explicit
``App(proxy=...)``, a server whose certificate is not trusted (refused, one line) and the
same server trusted through ``App(ca_bundle=...)``; and the OAuth2 token endpoint reached
through the same proxy and CAs."""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import trustme

from synckit import (
    App,
    ConfigurationError,
    Connector,
    OAuth2,
    OAuth2Config,
    Page,
    RetryableError,
    SyncContext,
)
from synckit.runtime.credentials.oauth import token_client
from synckit.store.db import Database
from tests.loopback import LoopbackProxy, LoopbackServer, Request

PROXY_VARIABLES = (
    "http_proxy", "https_proxy", "all_proxy", "no_proxy",
    "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY",
)  # fmt: skip


class Api(Connector):
    name = "api"
    base_url = "http://placeholder"

    async def poll(self, ctx: SyncContext, checkpoint: Any) -> AsyncIterator[Page]:
        yield Page([])

    async def handle(self, ctx: SyncContext, record: Any) -> None:
        pass


def hello(req: Request) -> tuple[int, dict[str, str], bytes]:
    return 200, {"Content-Type": "application/json"}, b'{"hello": "world"}'


@pytest.fixture(autouse=True)
def no_proxy_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test sets the proxy variables it means; none leak in from the machine."""
    for name in PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def proxy() -> Iterator[LoopbackProxy]:
    p = LoopbackProxy()
    yield p
    p.close()


@pytest.fixture
def ca() -> trustme.CA:
    return trustme.CA()


def tls_server(ca: trustme.CA, handler: Any) -> LoopbackServer:
    """An HTTPS server on 127.0.0.1 whose certificate a CA of this test alone signed."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(context)
    return LoopbackServer(handler, tls=context)


@pytest.fixture
def https_server(ca: trustme.CA) -> Iterator[LoopbackServer]:
    server = tls_server(ca, hello)
    yield server
    server.close()


@pytest.fixture
def http_server() -> Iterator[LoopbackServer]:
    server = LoopbackServer(hello)
    yield server
    server.close()


async def get(app: App, db: Database, url: str) -> httpx.Response:
    """One ``ctx.http`` GET of a tenant of ``app`` (a script's context: its own
    connections, built as a worker's are)."""
    await app.add_tenant(db, "acme", "api", {})
    async with app.context(db, "acme") as ctx:
        response = await ctx.http.get(url)
        await response.aread()
        return response


async def test_http_proxy_from_the_environment_carries_the_request(
    db: Database,
    proxy: LoopbackProxy,
    http_server: LoopbackServer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("HTTP_PROXY", proxy.url)
    response = await get(App([Api]), db, f"{http_server.url}/v1/things")
    assert response.json() == {"hello": "world"}
    assert proxy.seen == [f"GET {http_server.url}/v1/things HTTP/1.1"]
    assert [r.path for r in http_server.requests] == ["/v1/things"]


async def test_https_proxy_from_the_environment_tunnels_with_connect(
    db: Database,
    proxy: LoopbackProxy,
    https_server: LoopbackServer,
    ca: trustme.CA,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Lower-case, scheme-less, as curl accepts it; the tunnelled TLS is verified end to
    end against the App's CA bundle."""
    bundle = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(bundle))
    monkeypatch.setenv("https_proxy", proxy.url.removeprefix("http://"))
    response = await get(App([Api], ca_bundle=bundle), db, f"{https_server.url}/v1/things")
    assert response.json() == {"hello": "world"}
    assert proxy.seen == [f"CONNECT {https_server.url.removeprefix('https://')} HTTP/1.1"]
    assert [r.path for r in https_server.requests] == ["/v1/things"]


async def test_no_proxy_names_the_hosts_reached_directly(
    db: Database,
    proxy: LoopbackProxy,
    http_server: LoopbackServer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("HTTP_PROXY", proxy.url)
    monkeypatch.setenv("NO_PROXY", "example.com,127.0.0.1")
    response = await get(App([Api]), db, f"{http_server.url}/direct")
    assert response.status_code == 200
    assert proxy.seen == []
    assert [r.path for r in http_server.requests] == ["/direct"]


async def test_an_apps_own_proxy_is_used_without_any_environment(
    db: Database, proxy: LoopbackProxy, http_server: LoopbackServer
) -> None:
    response = await get(App([Api], proxy=proxy.url), db, f"{http_server.url}/mine")
    assert response.status_code == 200
    assert proxy.seen == [f"GET {http_server.url}/mine HTTP/1.1"]


async def test_an_untrusted_certificate_is_refused_in_one_line_naming_the_server(
    db: Database, https_server: LoopbackServer
) -> None:
    """The error ctx.http raises (retryable, as any failed connect) says which server, why
    and what to do, in one line; the transport's own error is its cause."""
    with pytest.raises(RetryableError) as caught:
        await get(App([Api]), db, f"{https_server.url}/v1/things")
    message = str(caught.value)
    host_port = https_server.url.removeprefix("https://")
    assert "\n" not in message
    assert f"ConnectError: TLS certificate of {host_port} not trusted (" in message
    assert message.endswith("give it to App(ca_bundle=...)")
    assert isinstance(caught.value.__cause__, httpx.ConnectError)
    assert https_server.requests == []  # nothing was sent over the refused connection


async def test_a_custom_ca_bundle_makes_the_same_server_trusted(
    db: Database, https_server: LoopbackServer, ca: trustme.CA, tmp_path: Path
) -> None:
    bundle = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(bundle))
    response = await get(App([Api], ca_bundle=str(bundle)), db, f"{https_server.url}/ok")
    assert response.json() == {"hello": "world"}
    assert [r.path for r in https_server.requests] == ["/ok"]


def test_a_proxy_or_bundle_that_cannot_work_is_one_configuration_line(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match=r"^proxy .*must be an http:// or https://"):
        App([Api], proxy="socks5://127.0.0.1:1080")
    missing = tmp_path / "nowhere.pem"
    with pytest.raises(ConfigurationError, match=r"^ca_bundle .*nowhere\.pem.* does not load"):
        App([Api], ca_bundle=missing)
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate\n")
    with pytest.raises(ConfigurationError, match=r"^ca_bundle .*garbage\.pem.* does not load"):
        App([Api], ca_bundle=garbage)


# --- the OAuth2 token endpoint -----------------------------------------------------------


def token_endpoint(req: Request) -> tuple[int, dict[str, str], bytes]:
    body = b'{"access_token": "at-1", "token_type": "Bearer", "expires_in": 3600}'
    return 200, {"Content-Type": "application/json"}, body


@pytest.fixture
def https_token_endpoint(ca: trustme.CA) -> Iterator[LoopbackServer]:
    server = tls_server(ca, token_endpoint)
    yield server
    server.close()


async def test_the_token_endpoint_is_reached_through_the_apps_proxy_and_trusted_by_its_cas(
    db: Database,
    proxy: LoopbackProxy,
    https_token_endpoint: LoopbackServer,
    ca: trustme.CA,
    tmp_path: Path,
) -> None:
    """A token refresh goes out as the API's requests do: through ``App(proxy=...)``,
    verifying the endpoint against ``App(ca_bundle=...)`` (it went direct, trusting only
    the default CAs: behind a company's TLS-inspecting proxy every refresh failed)."""
    bundle = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(bundle))
    app = App([Api], proxy=proxy.url, ca_bundle=bundle)
    cfg = OAuth2Config(
        f"{https_token_endpoint.url}/token", "id", "secret", grant="client_credentials"
    )
    await app.add_tenant(db, "acme", "api", {})
    async with app.context(db, "acme") as ctx:
        auth = ctx.auth_for(OAuth2(cfg))
    assert getattr(auth, "network", None) == app.network  # what the refresh goes through

    async with token_client(cfg, network=app.network) as client:
        token = await client.fetch_token(cfg.token_url, grant_type="client_credentials")
    assert token["access_token"] == "at-1"
    hostport = https_token_endpoint.url.removeprefix("https://")
    assert proxy.seen == [f"CONNECT {hostport} HTTP/1.1"]
    assert [r.path for r in https_token_endpoint.requests] == ["/token"]

    # Without the App's network: the test's CA is not among the default ones.
    with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
        async with token_client(cfg) as client:
            await client.fetch_token(cfg.token_url, grant_type="client_credentials")
