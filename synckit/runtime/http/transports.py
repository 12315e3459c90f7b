"""How a connector's client reaches its API: the network it goes through (a proxy, the
trusted CAs: :func:`network_of`), the TLS context, the HTTP/1.1 transport, and the
connections a worker keeps across its cycles (:func:`shared_connections`: a cycle
borrows an idle transport of its API and gives it back)."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import os
import ssl
import weakref
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
import structlog

from synckit.errors.exceptions import ConfigurationError
from synckit.redaction import redact_text
from synckit.runtime.http.http1 import Http11Transport, new_transport
from synckit.runtime.http.network import PROXY_SCHEMES, Network

__all__ = [
    "DEFAULT_NETWORK",
    "borrow_transport",
    "give_back_transport",
    "network_of",
    "shared_connections",
    "tls_context",
    "transport_for",
]

log = structlog.get_logger("synckit.http")


@functools.cache
def tls_context(ca_bundle: str | None = None) -> ssl.SSLContext:
    """The TLS context of every connector's transport, built once per process and CA
    bundle (loading one costs ~50 ms of CPU: built per cycle, it capped a worker at ~15
    poll cycles/s). ``ca_bundle``: a PEM file of the CAs to trust instead of the default
    bundle (``App(ca_bundle=...)``)."""
    if ca_bundle is None:
        return httpx.create_ssl_context()
    return ssl.create_default_context(cafile=ca_bundle)


#: A client's network when its App names none: the environment's proxies, the default CAs.
DEFAULT_NETWORK = Network()


def network_of(proxy: str | None, ca_bundle: str | os.PathLike[str] | None) -> Network:
    """The :class:`Network` of ``App(proxy=..., ca_bundle=...)``, checked now: a proxy URL
    httpx cannot use, or a CA bundle that does not load, is one ConfigurationError line."""
    if proxy is not None:
        try:
            url = httpx.URL(proxy)
        except httpx.InvalidURL as exc:
            raise ConfigurationError(f"proxy {proxy!r} is not a URL: {exc}") from None
        if url.scheme not in PROXY_SCHEMES or not url.host:
            raise ConfigurationError(
                f"proxy {redact_text(proxy)!r} must be an http:// or https:// URL with a host"
            )
    bundle = os.fspath(ca_bundle) if ca_bundle is not None else None
    if bundle is not None:
        try:
            tls_context(bundle)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigurationError(f"ca_bundle {bundle!r} does not load: {exc}") from None
    return Network(proxy=proxy, ca_bundle=bundle)


def transport_for(network: Network) -> Http11Transport:
    """A new transport reaching the network as ``network`` says (its proxies, from the
    environment's variables as they are now, and CAs)."""
    return new_transport(tls_context(network.ca_bundle), network.proxies())


# --- connections kept across a worker's cycles ------------------------------------------
#
# A cycle's client is its tenant's own (auth, pacing, base URL), but the connections under
# it need not be: a transport per cycle opened a TCP (and TLS) connection per cycle, a
# third of the CPU of a trivial poll. While a worker runs, a context borrows a transport
# from its connector's free list on the worker's event loop and gives it back when it
# closes, keep-alive connections and all. Not one pool shared by every cycle: httpcore
# scans a pool's every connection (twice, quadratically) for each request, so a pool of
# a hundred connections cost more than new connections did; a borrowed transport holds
# the one or few connections of one cycle. Outside a worker (a script's App.context, a
# test), a context keeps a transport of its own, closed with it.

#: Idle transports a connector's free list keeps (more are closed when given back).
IDLE_TRANSPORTS = 256


@dataclasses.dataclass(eq=False)
class _Lending:
    holders: int = 0
    idle: dict[tuple[str, Network], list[httpx.AsyncBaseTransport]] = dataclasses.field(
        default_factory=dict
    )


_lending: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Lending] = (
    weakref.WeakKeyDictionary()
)


@asynccontextmanager
async def shared_connections() -> AsyncIterator[None]:
    """While open, contexts opened on this event loop borrow their transports
    (:func:`borrow_transport`); the idle ones close when the last holder leaves (a
    worker holds this while it runs)."""
    lending = _lending.setdefault(asyncio.get_running_loop(), _Lending())
    lending.holders += 1
    try:
        yield
    finally:
        lending.holders -= 1
        if lending.holders == 0:
            idle, lending.idle = lending.idle, {}
            for transports in idle.values():
                for transport in transports:
                    await _close_quietly(transport)


def borrow_transport(
    connector: str, network: Network = DEFAULT_NETWORK
) -> httpx.AsyncBaseTransport | None:
    """A transport for one context of ``connector`` on ``network``, with the connections
    a previous context left open, or None when no worker lends transports on this event loop
    (:func:`shared_connections`). Its connections carry no credential: auth is the
    client's. Give it back with :func:`give_back_transport`."""
    lending = _lending.get(asyncio.get_running_loop())
    if lending is None or lending.holders == 0:
        return None
    idle = lending.idle.get((connector, network))
    if idle:
        return idle.pop()  # the most recently used: its connections are the freshest
    return transport_for(network)


async def give_back_transport(
    connector: str, transport: httpx.AsyncBaseTransport, network: Network = DEFAULT_NETWORK
) -> None:
    """Return a borrowed transport to the free list, or close it: when nobody lends any
    more, when the list is full, or when a connection of it is still busy (a response
    the connector never closed must not hold a connection of the next cycle)."""
    lending = _lending.get(asyncio.get_running_loop())
    if lending is not None and lending.holders > 0 and _all_idle(transport):
        idle = lending.idle.setdefault((connector, network), [])
        if len(idle) < IDLE_TRANSPORTS:
            idle.append(transport)
            return
    await _close_quietly(transport)


def _all_idle(transport: httpx.AsyncBaseTransport) -> bool:
    if isinstance(transport, Http11Transport):
        return transport.all_idle()
    # httpx keeps its httpcore pool in ``_pool`` (every 0.2x release); unknown: not idle.
    connections = getattr(getattr(transport, "_pool", None), "connections", None)
    if connections is None:
        return False
    return all(c.is_idle() or c.is_closed() for c in connections)


async def _close_quietly(transport: httpx.AsyncBaseTransport) -> None:
    try:
        await transport.aclose()
    except Exception as exc:  # its sockets are gone with it either way
        log.warning("http.transport_close_failed", error=repr(exc)[:300])
