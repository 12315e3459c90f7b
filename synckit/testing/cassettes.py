"""Record a real API's answers once, replay them in tests: VCR.py cassettes, secrets scrubbed.

Recording and replay are VCR.py's (``pip install 'synckit[testing]'`` installs it and
pytest-recording); this module adds what a connector's cassettes need: nothing secret is
written. Before a request or response is stored, every header whose name reads as a
credential (``Authorization``, ``Cookie``, ``Set-Cookie``, ``X-Api-Key``...), every query
or form parameter and JSON field that does (``api_key``, ``access_token``,
``client_secret``...), and every secret-looking piece of text (``Bearer ...``, JWTs,
well-known token formats) becomes ``***`` by synckit's own redaction
(:func:`synckit.runtime.observe.logging.redact`), as do the exact ``secrets`` given, wherever they
appear. Replay scrubs the live request the same way before matching it, so a cassette
recorded with one token replays with another. Compressed answers are stored decoded so
their bodies can be scrubbed.

Directly::

    from synckit.testing.cassettes import use_cassette

    async def test_tickets_page(synckit_db):
        with use_cassette("tests/cassettes/tickets.yaml", secrets=[TOKEN]):
            result = await app.poll(synckit_db, "acme")

The first run (no file yet) records against the real API; later runs replay, and a
request the cassette does not hold fails instead of reaching the network
(``record_mode="once"``; ``"none"`` never records, ``"new_episodes"`` adds).

With pytest-recording, ``@pytest.mark.vcr`` tests get the same scrubbing by default
(synckit's pytest plugin installs it through ``pytest_recording_configure``); a project's
``vcr_config`` fixture may add known values with ``scrubbing(secrets=[...])``.
"""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Iterable
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import vcr
from vcr.cassette import CassetteContextDecorator
from vcr.request import Request as VcrRequest

from synckit.runtime.observe.logging import REDACTED, is_secret_key, redact, redact_text

__all__ = [
    "install_scrubbing",
    "recorder",
    "scrub_body",
    "scrub_request",
    "scrub_response",
    "scrubbing",
    "use_cassette",
]

#: How a cassette file is written: YAML, readable in a review.
SERIALIZER = "yaml"


def _text(value: str, key: str | None, known: tuple[str, ...]) -> str:
    if key is not None and is_secret_key(key) and value:
        return REDACTED
    return redact_text(value, known)


def _query(query: str, known: tuple[str, ...]) -> str:
    if not query:
        return query
    pairs = parse_qsl(query, keep_blank_values=True)
    return urlencode([(k, _text(v, k, known)) for k, v in pairs], safe="*$")


def scrub_body(body: bytes | str | None, content_type: str, known: Iterable[str] = ()) -> Any:
    """``body`` with its secrets replaced: JSON by key at any depth and inside strings,
    a form by parameter name, any other text by
    :func:`~synckit.runtime.observe.logging.redact_text`.
    A body that is not text is returned as it is."""
    if body is None or body in (b"", ""):
        return body
    secrets = tuple(known)
    raw = body.encode() if isinstance(body, str) else body
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return body
    kind = content_type.split(";", 1)[0].strip().lower()
    if kind == "application/json" or kind.endswith("+json") or text.lstrip()[:1] in ("{", "["):
        try:
            data = json.loads(text)
        except ValueError:
            pass
        else:
            return json.dumps(redact(data, known=secrets)).encode()
    if kind == "application/x-www-form-urlencoded":
        return _query(text, secrets).encode()
    return redact_text(text, secrets).encode()


def scrub_request(request: VcrRequest, known: Iterable[str] = ()) -> VcrRequest:
    """A copy of a VCR request with its credentials replaced (headers, URL, body)."""
    secrets = tuple(known)
    scrubbed = copy.deepcopy(request)
    for name in list(scrubbed.headers):
        scrubbed.headers[name] = _text(str(scrubbed.headers[name]), name, secrets)
    parts = urlsplit(scrubbed.uri)
    netloc = parts.netloc.rsplit("@", 1)[-1]  # user:password@ never reaches a cassette
    path = redact_text(parts.path, secrets)
    scrubbed.uri = urlunsplit(
        (parts.scheme, netloc, path, _query(parts.query, secrets), parts.fragment)
    )
    content_type = str(scrubbed.headers.get("content-type", ""))
    scrubbed.body = scrub_body(scrubbed.body_bytes, content_type, secrets)
    if "content-length" in scrubbed.headers and isinstance(scrubbed.body_bytes, bytes):
        scrubbed.headers["content-length"] = str(len(scrubbed.body_bytes))
    return scrubbed


def scrub_response(response: dict[str, Any], known: Iterable[str] = ()) -> dict[str, Any]:
    """A copy of a VCR response (``status``/``headers``/``body``) with credentials
    replaced: ``Set-Cookie`` and other secret headers, and secrets in the body."""
    secrets = tuple(known)
    scrubbed = copy.deepcopy(response)
    headers: dict[str, list[str]] = scrubbed.get("headers", {})
    for name, values in headers.items():
        headers[name] = [_text(str(v), name, secrets) for v in values]
    content_type = next(
        (vs[0] for n, vs in headers.items() if n.lower() == "content-type" and vs), ""
    )
    body = scrubbed.get("body", {})
    if isinstance(body, dict) and "string" in body:
        body["string"] = scrub_body(body["string"], content_type, secrets)
        size = len(body["string"]) if isinstance(body["string"], bytes | str) else None
        for name in headers:
            if name.lower() == "content-length" and size is not None:
                headers[name] = [str(size)]
    return scrubbed


def scrubbing(secrets: Iterable[str] = ()) -> dict[str, Any]:
    """VCR options that scrub every stored request and response (``secrets``: exact
    values to remove too, e.g. a test tenant's API token). Pass them to ``vcr.VCR``, to
    ``use_cassette`` or return them from pytest-recording's ``vcr_config`` fixture."""
    known = tuple(s for s in secrets if s)
    return {
        "before_record_request": lambda request: scrub_request(request, known),
        "before_record_response": lambda response: scrub_response(response, known),
        "decode_compressed_response": True,
    }


def recorder(
    cassette_dir: str | os.PathLike[str] | None = None,
    *,
    record_mode: str = "once",
    secrets: Iterable[str] = (),
    **options: Any,
) -> vcr.VCR:
    """A ``vcr.VCR`` whose cassettes are scrubbed (see the module docstring)."""
    config: dict[str, Any] = {"serializer": SERIALIZER, "record_mode": record_mode}
    if cassette_dir is not None:
        config["cassette_library_dir"] = os.fspath(cassette_dir)
    config.update(scrubbing(secrets))
    config.update(options)
    return vcr.VCR(**config)


def use_cassette(
    path: str | os.PathLike[str],
    *,
    record_mode: str = "once",
    secrets: Iterable[str] = (),
    **options: Any,
) -> CassetteContextDecorator:
    """Record to (or replay from) the cassette file at ``path``, scrubbed; a context
    manager and a decorator. ``options`` are VCR.py's (``match_on``, ``allow_playback_repeats``...).
    """
    return recorder(record_mode=record_mode, secrets=secrets, **options).use_cassette(
        os.fspath(path)
    )


def install_scrubbing(vcr_instance: vcr.VCR, secrets: Iterable[str] = ()) -> None:
    """Make scrubbing ``vcr_instance``'s default (options given per cassette still win)."""
    for name, value in scrubbing(secrets).items():
        setattr(vcr_instance, name, value)
