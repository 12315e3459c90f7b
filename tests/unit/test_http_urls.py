"""ctx.http's client parses a request's URL once (synckit.runtime.http.client.OneParseClient):
for any path, query and params, the request it builds has exactly the URL httpx's own
client builds, or both refuse it alike."""

from __future__ import annotations

import functools
from typing import Any

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis_budget import examples  # type: ignore[import-not-found]

from synckit.runtime.http.client import OneParseClient

BASES = [
    "http://127.0.0.1:8080",
    "https://api.example.com/v2/",
    "https://user:pw@xn--bcher-kva.example/api",
    "http://[::1]:9/x%20y/",
]

_text = st.text(
    st.characters(codec="utf-8", exclude_categories=("Cs",)),
    max_size=12,
)
_paths = st.lists(_text, min_size=1, max_size=4).map(lambda parts: "/" + "/".join(parts))
_values = st.one_of(_text, st.integers(), st.booleans(), st.none(), st.floats(allow_nan=False))
_params = st.one_of(
    st.none(),
    st.dictionaries(_text, st.one_of(_values, st.lists(_values, max_size=3)), max_size=4),
    st.lists(st.tuples(_text, _values), max_size=4),
)


@functools.cache
def _clients(base: str) -> tuple[httpx.AsyncClient, httpx.AsyncClient]:
    """synckit's and httpx's (built once: a client makes its TLS context, ~40 ms)."""
    transport = httpx.MockTransport(lambda request: httpx.Response(200))
    return (
        OneParseClient(base_url=base, transport=transport),
        httpx.AsyncClient(base_url=base, transport=transport),
    )


def _built(client: httpx.AsyncClient, url: str, params: Any) -> str:
    try:
        return str(client.build_request("GET", url, params=params).url)
    except Exception as exc:  # both must refuse alike
        return f"refused: {type(exc).__name__}"


@pytest.mark.parametrize("base", BASES)
@settings(max_examples=examples(200), deadline=None)
@given(path=_paths, query=st.one_of(st.just(""), _text.map(lambda q: "?" + q)), params=_params)
def test_the_url_is_the_one_httpx_builds(base: str, path: str, query: str, params: Any) -> None:
    ours, theirs = _clients(base)
    url = path + query
    assert _built(ours, url, params) == _built(theirs, url, params)


@pytest.mark.parametrize(
    "url",
    [
        "/t/acme/items",
        "/a b/ü?x=1",
        "/../etc/./passwd",
        "//other.example/x",
        "/p#frag",
        "relative/path",
        "https://elsewhere.example/abs",
        "/%2F%zz",
    ],
)
@pytest.mark.parametrize(
    "params",
    [None, {}, {"": []}, {"k": []}, {"page": 2, "q": "a b&c=d/é"}, [("k", "1"), ("k", "2")]],
)
def test_edge_urls_match_httpx(url: str, params: Any) -> None:
    for base in BASES:
        ours, theirs = _clients(base)
        assert _built(ours, url, params) == _built(theirs, url, params), base


def test_the_one_parse_path_is_taken() -> None:
    """The path that matters parses once: httpx's own path would parse three times."""
    import httpx._urlparse as parser

    calls = 0
    real = parser.urlparse

    def counting(url: str = "", **kwargs: Any) -> Any:
        nonlocal calls
        calls += 1
        return real(url, **kwargs)

    client = OneParseClient(base_url="http://127.0.0.1:9/api/")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(parser, "urlparse", counting)
        mp.setattr("httpx._urls.urlparse", counting)
        request = client.build_request("GET", "/t/acme/items", params={"page": 3})
    assert str(request.url) == "http://127.0.0.1:9/api/t/acme/items?page=3"
    assert calls == 1
