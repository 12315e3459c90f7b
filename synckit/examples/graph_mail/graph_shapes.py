"""What Graph's answers look like, shared by the simulator's parts: its well-known mail
folders, its timestamps and its error bodies."""

from __future__ import annotations

from datetime import UTC, datetime

from synckit.testing.replies import Reply

__all__ = ["FOLDERS", "folder_name", "graph_error", "iso"]

#: The well-known mail folders every simulated mailbox has.
FOLDERS = ("inbox", "sentitems", "drafts", "deleteditems", "archive")


def iso(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def graph_error(status: int, code: str, message: str) -> Reply:
    return Reply.json({"error": {"code": code, "message": message}}, status)


def folder_name(folder: str) -> str | None:
    name = folder.lower()
    return name if name in FOLDERS else None
