"""Untrusted text made safe to print on a terminal: control characters shown escaped.

Error messages, API bodies and stored rows may hold terminal escape sequences (``ESC ]0;``
sets a window title, ``ESC [2J`` clears the screen, a C1 ``CSI`` does the same on some
terminals) or Unicode bidirectional controls that make a line read differently from what
it holds. Printed as they are, they act on the operator's terminal; through
:func:`printable` they are seen as what they are: ``\\x1b]0;pwned``.

One mechanism for the CLI's tables, ``show`` views and plain lines, the worker's console
logs and the web console; JSON output needs none of it (``json.dumps`` escapes control
characters itself).
"""

from __future__ import annotations

__all__ = ["printable"]


def _escape(code: int) -> str:
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


# C0 controls, DEL and C1 controls; the bidirectional embeddings, overrides and isolates
# and the marks (a "Trojan source" line); the line and paragraph separators, which some
# terminals and editors break lines on.
_CONTROLS = [
    *range(0x00, 0x20),
    0x7F,
    *range(0x80, 0xA0),
    0x061C,
    0x200E,
    0x200F,
    *range(0x202A, 0x202F),
    *range(0x2066, 0x206A),
    0x2028,
    0x2029,
]
_ONE_LINE = {code: _escape(code) for code in _CONTROLS}
# Newlines and tabs lay out a multi-line view (a traceback) and act on nothing else.
_MULTI_LINE = {code: s for code, s in _ONE_LINE.items() if code not in (0x09, 0x0A)}


def printable(text: str, *, keep_newlines: bool = False) -> str:
    """``text`` with every control character shown as an escape (``\\x1b``, ``\\u202e``).

    ``keep_newlines`` keeps ``\\n`` and ``\\t`` for views that print several lines (a
    traceback); a carriage return is escaped all the same, since it overwrites a line.
    """
    return text.translate(_MULTI_LINE if keep_newlines else _ONE_LINE)
