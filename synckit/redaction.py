"""The one redaction step: secrets out of every text and value synckit stores or prints.

Pure functions at the bottom of the package (the store redacts what it writes, logging
what it renders): values of secret-looking keys at any depth, secret-looking pieces of any
string (``Bearer xyz``, ``access_token=xyz``, a URL's password, a JWT, and the other shapes
the hostile audit found), and a tenant's own known secret values, bound per context with
:func:`bind_known_secrets`, scrubbed by value.
"""

from __future__ import annotations

import functools
import itertools
import json
import re
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any
from urllib.parse import quote, quote_plus

REDACTED = "***"

# Keys whose value is a secret, compared lower-cased with "-" read as "_".
SECRET_KEYS = frozenset(
    {
        "access_token",
        "refresh_token",
        "id_token",
        "client_secret",
        "client_assertion",
        "password",
        "passwd",
        "pwd",
        "secret",
        "authorization",
        "proxy_authorization",
        "api_key",
        "apikey",
        "x_api_key",
        "token",
        "token_set",
        "cookie",
        "set_cookie",
        "private_key",
        "signature",
        "sig",
    }
)
# A name holding one of these words names a secret (x_token_value, aws_secret_access_key,
# db_password, session_cookie)...
_SECRET_WORDS = frozenset(
    {
        "token",
        "secret",
        "password",
        "passwd",
        "pwd",
        "apikey",
        "authorization",
        "cookie",
        "credential",
        "credentials",
        "signature",
        "assertion",
    }
)
# ...as does one of these word pairs (an ``access_key`` names a secret, a ``resource_key``
# does not).
_SECRET_PAIRS = frozenset(
    {("api", "key"), ("access", "key"), ("private", "key"), ("secret", "key"), ("session", "id")}
)
# ...unless its last word says it is about the secret, not the secret itself.
_ABOUT_WORDS = frozenset(
    {"at", "in", "type", "expires", "expiry", "url", "endpoint", "count", "kind", "name", "id"}
)
# Names that read like a secret but are not one.
_NOT_SECRET = frozenset({"claim_token", "session_id_hint"})
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")


def _words(key: str) -> list[str]:
    return [w for w in re.split(r"[_\-.\s]+", _CAMEL.sub("_", key).lower()) if w]


def is_secret_key(key: object) -> bool:
    """Whether a mapping key names a secret (``access_token``, ``X-Api-Key``,
    ``accessToken``, ``X-Token-Value``, ``aws_secret_access_key``...)."""
    if not isinstance(key, str) or not key or len(key) > 200:
        return False
    return _is_secret_name(key)


@functools.lru_cache(maxsize=4096)  # log fields repeat the same few names
def _is_secret_name(key: str) -> bool:
    words = _words(key)
    name = "_".join(words)
    if name in _NOT_SECRET:
        return False
    if name in SECRET_KEYS:
        return True
    if len(words) > 1 and words[-1] in _ABOUT_WORDS and name not in ("session_id",):
        return False
    if any(w in _SECRET_WORDS for w in words):
        return True
    return any(pair in _SECRET_PAIRS for pair in itertools.pairwise(words))


# A value: a double-quoted string (escapes honoured), a string quoted inside a JSON string
# (\"...\"), a single-quoted one, or bare words up to the next key, separator or line end,
# so "correct horse battery" is masked whole, not its first word.
_BARE = r"[^\s&;,\"'}\]<>]+"
_VALUE = (
    r"(?P<v>\\+\"(?:(?!\\+\").)*\\+\""
    r"|\"(?:\\.|[^\"\\])*\""
    r"|'[^'\n]*'"
    rf"|(?:(?P<scheme>(?i:bearer|basic|digest|token)\s+))?{_BARE}"
    rf"(?:[ \t]+(?![\w.-]+\s*[=:])(?!\*\*\*){_BARE})*)"
)
# A key that may name a secret, possibly quoted (also quoted inside a JSON string).
_KEY_VALUE = re.compile(
    r"(?<![\w.-])(?P<q>\\*[\"']?)(?P<k>[A-Za-z_][\w.-]{0,80}?)(?P=q)(?P<sep>[ \t]*[=:][ \t]*)"
    + _VALUE
)
_KEY_HINT = re.compile(
    r"(?i)token|secret|passw|pwd|key|auth|cookie|credential|sig|assertion|session"
)
# Every rule below needs one of these in the text; checked first, as nearly all log
# fields have none.
_ANY_HINT = re.compile(
    r"[=:/@]|-----|(?i:bearer|basic|digest)|gh[pousr]_|github_pat_|_live_|_test_|xox|glpat-"
    r"|shp|npm_|sq0|AKIA|ASIA|AIza|SG\.|eyJ"
)
_TEXT_RULES: tuple[tuple[re.Pattern[str], str], ...] = (
    # PEM blocks, whole (an unterminated one to the end).
    (
        re.compile(
            r"-----BEGIN [A-Z0-9 ]*(?:PRIVATE KEY|KEY)[A-Z ]*-----.*?"
            r"(?:-----END [A-Z0-9 ]*-----|\Z)",
            re.S,
        ),
        REDACTED,
    ),
    # Cookie headers quoted in text: every cookie on the line is a credential.
    (re.compile(r"(?im)\b((?:set-)?cookie\s*:\s*)[^\r\n]+"), r"\1***"),
    # Authorization schemes: "Bearer xyz" -> "Bearer ***".
    (re.compile(r"(?i)\b(bearer|basic|digest)(\s+)(?!\*\*\*)[A-Za-z0-9\-._~+/=]{3,}"), r"\1\2***"),
    # Query and form parameters that carry credentials in URLs (?key=, &sig=, ?code=).
    (
        re.compile(
            r"(?i)([?&;#](?:[\w.-]*(?:key|sig|signature|code|token|secret|pass|pwd|auth|"
            r"credential|session|jwt)[\w.-]*)=)(?!\*\*\*)[^&\s#\"'<>]+"
        ),
        r"\1***",
    ),
    # Credentials in URLs: scheme://user:password@host.
    (re.compile(r"(\b[a-zA-Z][\w+.-]*://[^/\s:@]*):[^@\s/]+@"), r"\1:***@"),
    # Tokens in URL paths: Telegram's /bot<token>, Slack and Discord webhooks.
    (re.compile(r"(/bot)\d+:[\w-]+"), r"\1***"),
    (
        re.compile(r"(?i)(hooks\.slack\.com/(?:services|workflows|triggers)/)[^\s\"'?#<>]+"),
        r"\1***",
    ),
    (re.compile(r"(?i)(/api/webhooks/\d+/)[\w-]+"), r"\1***"),
    # Well-known token formats, wherever they appear.
    (
        re.compile(
            r"\b(?:gh[pousr]_|github_pat_|(?:sk|rk|pk)_(?:live|test)_|xox[abposre]-|glpat-|"
            r"shp(?:at|ss|ca|pa)_|npm_|sq0(?:atp|csp)-|AKIA|ASIA|AIza|SG\.)[\w.\-]{8,}"
        ),
        REDACTED,
    ),
    # JSON Web Tokens.
    (re.compile(r"\beyJ[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]*"), REDACTED),
)


def _mask_pair(m: re.Match[str]) -> str:
    value = m.group("v")
    head = m.group(0)[: m.start("v") - m.start(0)]
    scheme = m.group("scheme") or ""
    if value[:1] in ('"', "'", "\\"):
        quote = re.match(r"\\*[\"']", value)
        q = quote.group(0) if quote else ""
        inner = value[len(q) : len(value) - len(q)]
        if inner == REDACTED:
            return m.group(0)
        return f"{head}{q}{REDACTED}{q}"
    if value[len(scheme) :] == REDACTED:
        return m.group(0)
    return f"{head}{scheme}{REDACTED}"


_KNOWN: ContextVar[tuple[str, ...]] = ContextVar("synckit_known_secrets", default=())
# Shorter values would mask ordinary words; no real credential is this short.
_MIN_KNOWN = 6


def scrub_values(text: str, values: Iterable[str]) -> str:
    """``text`` with every occurrence of each of ``values`` replaced by ``***``: also as
    URL-encoded and as escaped inside a JSON string (a tenant's own secrets, by value)."""
    for value in sorted({v for v in values if len(v) >= _MIN_KNOWN}, key=len, reverse=True):
        for form in _forms(value):
            if form in text:
                text = text.replace(form, REDACTED)
    return text


def _forms(value: str) -> set[str]:
    return {value, quote(value, safe=""), quote_plus(value), json.dumps(value)[1:-1]}


def secret_values(obj: Any) -> tuple[str, ...]:
    """The plain values of every ``SecretStr``/``SecretBytes`` in ``obj`` (a pydantic
    model, mapping or list, at any depth): what :func:`bind_known_secrets` takes."""
    found: list[str] = []
    _collect(obj, found, 0)
    return tuple(found)


def _collect(obj: Any, found: list[str], depth: int) -> None:
    if depth > 50:
        return
    from pydantic import BaseModel, SecretBytes, SecretStr

    if isinstance(obj, SecretStr):
        found.append(obj.get_secret_value())
    elif isinstance(obj, SecretBytes):
        found.append(obj.get_secret_value().decode("utf-8", "replace"))
    elif isinstance(obj, BaseModel):
        for name in type(obj).model_fields:
            _collect(getattr(obj, name, None), found, depth + 1)
    elif isinstance(obj, Mapping):
        for v in obj.values():
            _collect(v, found, depth + 1)
    elif isinstance(obj, list | tuple | set | frozenset):
        for v in obj:
            _collect(v, found, depth + 1)


@contextmanager
def bind_known_secrets(values: Iterable[str]) -> Iterator[None]:
    """Scrub ``values`` (a tenant's own secrets, see :func:`secret_values`) by value from
    every text redacted in this context: logs, and error texts stored while it lasts.
    Follows the asyncio task like the job context."""
    merged = tuple(dict.fromkeys((*_KNOWN.get(), *(v for v in values if v))))
    reset = _KNOWN.set(merged)
    try:
        yield
    finally:
        _KNOWN.reset(reset)


def redact_text(text: str, known: Iterable[str] = ()) -> str:
    """``text`` with secret-looking pieces replaced by ``***``: values of secret-named
    keys (``k=v``, ``"k": "v"``, ``k: v``, quoted or inside JSON inside JSON), credential
    query parameters, URL passwords and path tokens, cookies, PEM blocks, well-known token
    formats and JWTs; and, by value, ``known`` plus the secrets bound with
    :func:`bind_known_secrets`.

    The one redaction step for every error text, reason and payload synckit stores or
    prints."""
    bound = _KNOWN.get()
    if known or bound:
        text = scrub_values(text, (*known, *bound))
    if len(text) > _CACHED_LENGTH:
        return _apply_rules(text) if _ANY_HINT.search(text) else text
    # Short texts repeat: event names, levels, a worker's id, a resource key, a kind are
    # in every line of their job; the rules are pure, so their answer is kept (a hit
    # costs less than the hint search itself).
    done = _rules_cache.get(text)
    if done is None:
        if len(_rules_cache) >= _CACHED_TEXTS:
            _rules_cache.clear()
        # Most log fields ("job.succeeded", "acme") have no hint: nothing to look at.
        done = _apply_rules(text) if _ANY_HINT.search(text) else text
        _rules_cache[text] = done
    return done


#: redact_text keeps the rules' answer for texts up to this long, this many of them.
_CACHED_LENGTH = 200
_CACHED_TEXTS = 4096
_rules_cache: dict[str, str] = {}


def _scoped(pattern: re.Pattern[str]) -> str:
    """``pattern``'s text with its flags scoped to it, for an alternation of patterns."""
    flags = "".join(
        letter for flag, letter in ((re.I, "i"), (re.M, "m"), (re.S, "s")) if pattern.flags & flag
    )
    text = re.sub(r"^\(\?[aiLmsux]+\)", "", pattern.pattern)
    return f"(?{flags}:{text})" if flags else f"(?:{text})"


# Any of the rules at all: when none matches the text, none rewrites it (each rule sees
# the text unchanged by the ones before), and one search replaces ten substitutions.
_ANY_RULE = re.compile("|".join(_scoped(pattern) for pattern, _ in _TEXT_RULES))


def _apply_rules(text: str) -> str:
    if _ANY_RULE.search(text) is not None:
        for pattern, replacement in _TEXT_RULES:
            text = pattern.sub(replacement, text)
    return _mask_pairs_if_hinted(text)


def _mask_pairs_if_hinted(text: str) -> str:
    return _mask_pairs(text) if _KEY_HINT.search(text) else text


def _mask_pairs(text: str) -> str:
    # By hand rather than re.sub: a pair whose key is not a secret ("refused: ...") must
    # not swallow the text after its separator, where a secret pair may start.
    out: list[str] = []
    pos = 0
    while (m := _KEY_VALUE.search(text, pos)) is not None:
        if is_secret_key(m.group("k")):
            out.append(text[pos : m.start()])
            out.append(_mask_pair(m))
            pos = m.end()
        else:
            out.append(text[pos : m.end("sep")])
            pos = m.end("sep")
    out.append(text[pos:])
    return "".join(out)


def redact(value: Any, key: object = None, known: Iterable[str] = ()) -> Any:
    """``value`` with secrets removed: by key at any depth, and inside every string."""
    known = tuple(known)
    return _redact(value, key, known, 0)


def _redact(value: Any, key: object, known: tuple[str, ...], depth: int) -> Any:
    if is_secret_key(key) and value not in (None, "") and not isinstance(value, bool):
        return REDACTED
    if isinstance(value, str):
        return redact_text(value, known)
    if depth > 100:
        return REDACTED  # deeper than any real payload: not worth the risk of a leak
    if isinstance(value, Mapping):
        return {k: _redact(v, k, known, depth + 1) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [_redact(v, None, known, depth + 1) for v in value]
    if isinstance(value, BaseException):
        # Renderers would call str() on it later, past this processor.
        return f"{type(value).__name__}: {redact_text(str(value), known)}"
    return value
