"""OpenTelemetry test helpers: an SDK provider set for one test, and a span exporter
that appends each span as a JSON line to a file (for worker subprocesses)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import (
    SimpleSpanProcessor,
    SpanExporter,
    SpanExportResult,
)
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.util._once import Once


def _set_global(provider: TracerProvider | None) -> None:
    """Set (or clear) the global provider; the API allows one set per process, which a
    test process running many tests cannot live with."""
    trace._TRACER_PROVIDER_SET_ONCE = Once()  # type: ignore[attr-defined]
    trace._TRACER_PROVIDER = None  # type: ignore[attr-defined]
    if provider is not None:
        trace.set_tracer_provider(provider)


@contextmanager
def in_memory_tracing() -> Iterator[InMemorySpanExporter]:
    """Tracing on, to an in-memory exporter, inside the block; off again after it."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    _set_global(provider)
    try:
        yield exporter
    finally:
        _set_global(None)
        provider.shutdown()


def as_dict(span: ReadableSpan) -> dict[str, Any]:
    """What the tests read of a span, as plain data (the file exporter writes this)."""
    ctx = span.get_span_context()
    assert ctx is not None
    return {
        "name": span.name,
        "kind": span.kind.name,
        "trace_id": f"{ctx.trace_id:032x}",
        "span_id": f"{ctx.span_id:016x}",
        "parent_id": f"{span.parent.span_id:016x}" if span.parent else None,
        "links": [
            {"trace_id": f"{ln.context.trace_id:032x}", "span_id": f"{ln.context.span_id:016x}"}
            for ln in span.links
        ],
        "attributes": dict(span.attributes or {}),
        "events": [{"name": e.name, "attributes": dict(e.attributes or {})} for e in span.events],
        "status": span.status.status_code.name,
        "start": span.start_time,
        "end": span.end_time,
        "pid": os.getpid(),
    }


class FileSpanExporter(SpanExporter):
    """Appends each span as one JSON line (:func:`as_dict`) to ``path``."""

    def __init__(self, path: str | Path) -> None:
        self.path = str(path)

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        lines = "".join(json.dumps(as_dict(s), default=str) + "\n" for s in spans)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, lines.encode())
        finally:
            os.close(fd)
        return SpanExportResult.SUCCESS


def file_tracing(path: str | Path) -> TracerProvider:
    """Tracing on for this process, each span written to ``path`` as it ends."""
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(FileSpanExporter(path)))
    _set_global(provider)
    return provider


def read_spans(path: str | Path) -> list[dict[str, Any]]:
    p = Path(path)
    if not p.exists():
        return []
    return [json.loads(line) for line in p.read_text().splitlines() if line.strip()]
