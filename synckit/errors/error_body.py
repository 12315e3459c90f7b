"""What an API's error body says, in its own words (pure).

An API that refuses a call usually explains why in the body: Stripe's
``{"error": {"type": "card_error", "code": "card_declined", "message": "Your card has
insufficient funds."}}``, Graph's ``{"error": {"code": ..., "message": ...}}``, GitHub's
``{"message": ...}``, OAuth's ``{"error": ..., "error_description": ...}``. A connector
says where its API puts the message and the code with :class:`ErrorBody` (the
``error_body`` class attribute), or overrides ``Connector.describe_error`` for a shape no
path reaches. The :class:`ErrorDescription` it gives becomes part of the failure's reason
(``HTTP 402 Payment Required: card_error/card_declined: Your card has insufficient
funds.``: in the exception, the job's last error, the dead letter and the logs, always
redacted), and may choose the error class (``resource_missing`` is a 404's meaning
inside a 400).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

from synckit.errors.classify import ErrorClass

__all__ = ["DEFAULT_CODE_PATHS", "DEFAULT_MESSAGE_PATHS", "ErrorBody", "ErrorDescription"]

#: Where common APIs put their error message, tried in order (first string found wins).
DEFAULT_MESSAGE_PATHS: tuple[str, ...] = (
    "error.message",
    "error_description",
    "error.description",
    "message",
    "errors.0.message",
    "0.message",
    "detail",
    "title",
)
#: Where common APIs put their error code; every one found is kept, joined with "/".
DEFAULT_CODE_PATHS: tuple[str, ...] = ("error.type", "error.code", "code", "error", "0.errorCode")

# A text body (not JSON) is shown when it is this short and does not look like markup.
_TEXT_LIMIT = 300


@dataclass(frozen=True)
class ErrorDescription:
    """An error body read: the provider's ``message``, its ``code`` (``None`` when it has
    none), and the ``error_class`` it means (``None`` keeps the class the status gives)."""

    message: str
    code: str | None = None
    error_class: ErrorClass | None = None

    def text(self) -> str:
        """``"code: message"``, or whichever of the two there is."""
        if self.code and self.message:
            return f"{self.code}: {self.message}"
        return self.message or self.code or ""


def _paths(value: str | Sequence[str]) -> tuple[str, ...]:
    return (value,) if isinstance(value, str) else tuple(value)


@dataclass(frozen=True)
class ErrorBody:
    """Where an API's JSON error body keeps its message and code, and what codes mean.

    ``message`` and ``code`` are dotted paths into the body (``"error.message"``; a number
    indexes a list: ``"errors.0.message"``), one or several. The message is the first
    path holding a string; the code joins every path holding a string or a number, in
    order, with ``/`` (``code=("error.type", "error.code")`` gives
    ``card_error/card_declined``). ``classes`` maps a code (one part, or the joined
    whole) to the class the failure really is, e.g. ``{"resource_missing":
    ErrorClass.NOT_FOUND}``; an unmapped code keeps the class of the status.

    The default reads the common shapes (Stripe, Graph, GitHub, OAuth, Salesforce,
    RFC 9457 problem details). A body that is not JSON is described by its text when
    that is short and is not markup; any other body is not described.

    Example::

        class Payments(Connector[PaymentsConfig]):
            error_body = ErrorBody(
                message="error.message",
                code=("error.type", "error.code"),
                classes={"resource_missing": ErrorClass.NOT_FOUND},
            )
    """

    message: str | Sequence[str] = DEFAULT_MESSAGE_PATHS
    code: str | Sequence[str] = DEFAULT_CODE_PATHS
    classes: Mapping[str, ErrorClass] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "message", _paths(self.message))
        object.__setattr__(self, "code", _paths(self.code))
        object.__setattr__(self, "classes", MappingProxyType(dict(self.classes)))
        for path in (*self.message, *self.code):
            if not isinstance(path, str) or not path:
                raise ValueError(f"ErrorBody paths are non-empty dotted strings, not {path!r}")
        for key, value in self.classes.items():
            if not isinstance(value, ErrorClass):
                raise ValueError(f"ErrorBody classes[{key!r}] must be an ErrorClass")

    def describe(self, status: int, body: object) -> ErrorDescription | None:
        """The description of ``body`` (parsed JSON, or the text of a body that is not
        JSON), or None when it says nothing this spec can read."""
        if isinstance(body, str):
            text = " ".join(body.split())
            if not text or text.startswith("<") or len(text) > _TEXT_LIMIT:
                return None
            return ErrorDescription(message=text)
        message = next(
            (v for p in self.message if isinstance(v := _lookup(body, p), str) and v.strip()),
            "",
        )
        codes: list[str] = []
        for path in self.code:
            value = _lookup(body, path)
            if isinstance(value, bool) or not isinstance(value, str | int) or value == status:
                continue  # {"code": 400} repeats the status line
            text = str(value).strip()
            if text and text not in codes and text != message:
                codes.append(text)
        if not message and not codes:
            return None
        code = "/".join(codes) or None
        error_class = None
        for key in (code, *codes):
            if key is not None and key in self.classes:
                error_class = self.classes[key]
                break
        return ErrorDescription(message=message.strip(), code=code, error_class=error_class)


def _lookup(body: object, path: str) -> object:
    node = body
    for part in path.split("."):
        if isinstance(node, Mapping):
            node = node.get(part)
        elif isinstance(node, list) and part.isdigit():
            index = int(part)
            node = node[index] if index < len(node) else None
        else:
            return None
        if node is None:
            return None
    return node
