"""The console's safety decisions, pure: where it may listen, who may look, which POST
to accept. The web app applies them; nothing here does I/O."""

from __future__ import annotations

import hmac
import ipaddress
from urllib.parse import urlsplit

__all__ = [
    "bind_refusal",
    "csrf_valid",
    "host_refusal",
    "is_loopback",
    "origin_allowed",
    "safe_next",
    "token_valid",
]


def is_loopback(host: str) -> bool:
    """Whether binding ``host`` keeps the console on this machine.

    ``localhost`` counts; an empty host, ``0.0.0.0``, ``::`` or any other address or
    name does not (a name may resolve anywhere).
    """
    h = host.strip().strip("[]").lower()
    if h == "localhost":
        return True
    try:
        return ipaddress.ip_address(h).is_loopback
    except ValueError:
        return False


def bind_refusal(host: str, token: str | None) -> str | None:
    """Why the console must not start on ``host`` with ``token``, or None when it may."""
    if token is not None and len(token) < 16:
        return "the access token must be at least 16 characters"
    if not is_loopback(host) and not token:
        return (
            f"--host {host} is reachable from other machines: give an access token "
            "(--token or $SYNCKIT_WEB_TOKEN), or bind 127.0.0.1"
        )
    return None


def _host_name(host: str) -> str:
    """The name or address of a ``Host`` header, without its port."""
    h = host.strip().lower()
    if h.startswith("["):  # [::1]:8080
        return h[1 : h.find("]")] if "]" in h else h
    return h.rsplit(":", 1)[0] if h.count(":") == 1 else h


def host_refusal(
    host: str | None, *, token: str | None, allowed: tuple[str, ...] = ()
) -> str | None:
    """Why a request naming ``host`` (its ``Host`` header) must be refused, or None.

    Without a token the console listens on loopback only, so a request naming any other
    host came through a name that resolves to this machine for someone else's page (DNS
    rebinding): loopback names and addresses only. With ``allowed`` hosts (the public
    names of a console behind a token), those and loopback only; with a token and none
    named, any host (the token guards every request).
    """
    name = _host_name(host or "")
    if not name:
        return "the request names no Host"
    if is_loopback(name) or name.endswith(".localhost"):
        return None
    if allowed:
        if name in {_host_name(a) for a in allowed}:
            return None
        return f"Host {name!r} is not one this console serves (--allowed-host)"
    if token:
        return None
    return (
        f"Host {name!r} is not a loopback name or address: this console listens on loopback "
        "only (give --token and --allowed-host to serve it under another name)"
    )


def token_valid(expected: str | None, given: str | None) -> bool:
    """Whether ``given`` is the access token (always true when none is required)."""
    if not expected:
        return True
    if not given:
        return False
    return hmac.compare_digest(expected.encode(), given.encode())


def csrf_valid(cookie: str | None, submitted: str | None) -> bool:
    """Double-submit check: the form (or header) carries the value of the CSRF cookie.

    A page on another site can make the browser send the cookie but cannot read it, so
    it cannot put the same value in the form.
    """
    if not cookie or not submitted or len(cookie) < 16:
        return False
    return hmac.compare_digest(cookie.encode(), submitted.encode())


def origin_allowed(origin: str | None, host: str | None) -> bool:
    """A POST's ``Origin`` (when the browser sent one) must be the console's own host."""
    if not origin:
        return True
    if origin == "null" or not host:
        return False
    return urlsplit(origin).netloc.lower() == host.lower()


def safe_next(target: str | None, default: str = "/") -> str:
    """A local path to go back to after an action; anything else becomes ``default``
    (an action must not redirect to another site)."""
    if not target or not target.startswith("/") or target.startswith("//") or "\\" in target:
        return default
    return target
