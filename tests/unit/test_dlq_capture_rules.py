"""The capture's pure parts: what a failure does to its row (policy.decide_capture), and
how text that no engine stores (NUL, lone surrogates) is made storable."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from synckit.errors.dlq_policy import BASE_DELAY, REVIEW_CLASSES, CaptureDecision, decide_capture
from synckit.store.moments import REPLACEMENT, storable_text

NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
CLASSES = ["validation", "authorization", "transient", "server_error", "unknown", "timeout"]
PREVIOUS = [None, "pending", "review", "resolved", "ignored"]


@pytest.mark.parametrize("keep", [False, True])
@pytest.mark.parametrize("error_class", CLASSES)
def test_an_ignored_row_stays_ignored_whatever_the_failure(error_class: str, keep: bool) -> None:
    """An operator's ignore stands: nothing is reopened, rescheduled or reset."""
    assert decide_capture("ignored", error_class, now=NOW, keep_replay_count=keep) == (
        CaptureDecision("ignored", None, reopen=False, reset_replays=False)
    )


@pytest.mark.parametrize("previous", [p for p in PREVIOUS if p != "ignored"])
@pytest.mark.parametrize("error_class", CLASSES)
def test_any_other_row_opens_by_the_review_classes(previous: str | None, error_class: str) -> None:
    """Review at once for validation and authorization, else pending a minute from now
    (or at retry_at), with a fresh replay budget."""
    d = decide_capture(previous, error_class, now=NOW)
    if error_class in REVIEW_CLASSES:
        assert d == CaptureDecision("review", None, reopen=True, reset_replays=True)
    else:
        assert d == CaptureDecision("pending", NOW + BASE_DELAY, reopen=True, reset_replays=True)
    later = NOW + timedelta(hours=3)
    at = decide_capture(previous, error_class, now=NOW, retry_at=later)
    assert at.next_retry_at == (None if error_class in REVIEW_CLASSES else later)


@pytest.mark.parametrize("previous", ["pending", "review", "resolved"])
def test_keep_replay_count_keeps_the_spent_replays(previous: str) -> None:
    """A dead job re-run by a replay that died again: its budget runs out, not over."""
    assert not decide_capture(previous, "transient", now=NOW, keep_replay_count=True).reset_replays


def reference(text: str) -> str:
    """NUL and unpaired surrogates as U+FFFD, pairs joined: written out by hand, as a
    second opinion on storable_text."""
    out, i = [], 0
    while i < len(text):
        c = text[i]
        nxt = text[i + 1] if i + 1 < len(text) else ""
        if "\ud800" <= c <= "\udbff" and "\udc00" <= nxt <= "\udfff":
            out.append(chr(0x10000 + ((ord(c) - 0xD800) << 10) + (ord(nxt) - 0xDC00)))
            i += 2
            continue
        out.append(REPLACEMENT if c == "\x00" or "\ud800" <= c <= "\udfff" else c)
        i += 1
    return "".join(out)


HOSTILE = st.text(
    alphabet=st.one_of(
        st.characters(),
        st.sampled_from(["\x00", "\ud800", "\udbff", "\udc00", "\udfff", "\ud83d", "\ude00"]),
    )
)


@given(HOSTILE)
def test_storable_text_replaces_nul_and_lone_surrogates_only(text: str) -> None:
    """The result encodes as UTF-8, holds no NUL, and differs from the input only there."""
    got = storable_text(text)
    got.encode("utf-8")
    assert "\x00" not in got
    assert got == reference(text)


@given(st.text())
def test_storable_text_leaves_ordinary_text_alone(text: str) -> None:
    """Text without NUL (any Unicode, no lone surrogates) comes back as it was."""
    plain = text.replace("\x00", "")
    assert storable_text(plain) == plain
