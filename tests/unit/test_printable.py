"""printable(): control characters shown escaped, for terminals; and the console log renderer."""

from __future__ import annotations

import io

import pytest
import structlog
from hypothesis import given
from hypothesis import strategies as st

from synckit.printable import printable
from synckit.runtime.observe.logging import configure_logging


@pytest.mark.parametrize(
    "text", ["\x1b]0;pwned\x07", "a\x9bb", "\u202e", "x\ry", "\x00\x7f", "\u2028"]
)
def test_printable_escapes_every_control(text: str) -> None:
    """printable() leaves no control character, and shows each one as an escape."""
    out = printable(text)
    assert out.isprintable() and "\\" in out
    assert printable("line one\nline two\ttab", keep_newlines=True) == "line one\nline two\ttab"
    assert printable("a\nb") == "a\\x0ab"


@given(st.text())
def test_printable_output_holds_no_control_character(text: str) -> None:
    """Whatever the text, what printable() returns acts on no terminal."""
    out = printable(text)
    assert not any(ord(c) < 0x20 or 0x7F <= ord(c) < 0xA0 for c in out)
    assert not set(out) & {"\u202e", "\u2066", "\u200f", "\u2028"}


def test_console_logs_show_escapes_escaped() -> None:
    """The worker's console renderer prints an API's ESC ]0; as \\x1b, not raw."""
    out = io.StringIO()
    configure_logging(json_lines=False, stream=out)
    try:
        structlog.get_logger("t").warning(
            "job.failed \x1b[2J", error="boom \x1b]0;pwned\x07 \u202e", tight="a\x1b[2Jb"
        )
    finally:
        configure_logging()
    text = out.getvalue()
    assert "\x1b" not in text and "\u202e" not in text and "\x07" not in text
    assert "job.failed \\x1b[2J" in text and "a\\x1b[2Jb" in text
    assert "\\x1b]0;pwned\\x07 \\u202e" in text  # repr()'s escapes, not twice
