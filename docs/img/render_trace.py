"""Render one trace of ``synckit demo`` as a waterfall image (docs/img/demo-trace.png).

Run by hand from the checkout (needs the dev extra and Debian's chromium)::

    .venv/bin/python docs/img/render_trace.py

The demo runs in this process with the OpenTelemetry SDK's in-memory exporter; the
trace of the first poll job that made the most spans is drawn as the viewers do (one
row per span, indented under its parent, a bar for its time) and screenshot with
Playwright in Chromium. No viewer (Jaeger, Tempo) installs on this machine; a collector
shows the same tree.
"""

from __future__ import annotations

import asyncio
import html
import os
import sys
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from playwright.sync_api import sync_playwright
from rich.console import Console

from synckit.examples.graph_mail.demo import run_demo

OUT = Path(__file__).parent / "demo-trace.png"
CHROMIUM = os.environ.get("SYNCKIT_CHROMIUM", "/usr/bin/chromium")
SHOWN = (
    "synckit.tenant",
    "synckit.stream",
    "synckit.job.id",
    "synckit.job.attempt",
    "synckit.job.status",
    "http.response.status_code",
    "http.request.resend_count",
    "synckit.pace.outcome",
    "synckit.records",
    "synckit.failed",
    "synckit.checkpoint.committed",
    "synckit.error_class",
    "url.full",
)


def collect() -> list[ReadableSpan]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    with tempfile.TemporaryDirectory() as tmp, open(os.devnull, "w") as quiet:
        asyncio.run(run_demo(Path(tmp), out=Console(file=quiet)))
    return list(exporter.get_finished_spans())


def pick(spans: list[ReadableSpan]) -> list[ReadableSpan]:
    """The trace of the poll job with the most spans, preferring one that met a 429."""
    by_trace: dict[int, list[ReadableSpan]] = defaultdict(list)
    for s in spans:
        by_trace[s.context.trace_id].append(s)

    def score(group: list[ReadableSpan]) -> tuple[bool, int]:
        polls = any(s.name.startswith("synckit.poll") for s in group)
        limited = any((s.attributes or {}).get("http.response.status_code") == 429 for s in group)
        return polls and limited, len(group) if polls else 0

    return max(by_trace.values(), key=score)


def render(group: list[ReadableSpan]) -> str:
    ids = {s.context.span_id for s in group}
    kids: dict[int | None, list[ReadableSpan]] = defaultdict(list)
    for s in group:
        parent = s.parent.span_id if s.parent and s.parent.span_id in ids else None
        kids[parent].append(s)
    t0 = min(s.start_time or 0 for s in group)
    t1 = max(s.end_time or 0 for s in group)
    width = max(t1 - t0, 1)
    rows: list[str] = []

    def walk(parent: int | None, depth: int) -> None:
        for s in sorted(kids[parent], key=lambda x: x.start_time or 0):
            a: dict[str, Any] = dict(s.attributes or {})
            left = 100 * ((s.start_time or 0) - t0) / width
            span_w = max(100 * ((s.end_time or 0) - (s.start_time or 0)) / width, 0.3)
            ms = ((s.end_time or 0) - (s.start_time or 0)) / 1e6
            tags = " ".join(
                f"<span class=tag>{html.escape(k.removeprefix('synckit.'))}="
                f"{html.escape(str(a[k]))}</span>"
                for k in SHOWN
                if k in a
            )
            error = " error" if s.status.status_code.name == "ERROR" else ""
            rows.append(
                f"<div class='row{error}'><div class=name style='padding-left:{depth * 18}px'>"
                f"<b>{html.escape(s.name)}</b> <i>{s.kind.name.lower()}</i><br>{tags}</div>"
                f"<div class=lane><div class=bar style='left:{left:.2f}%;width:{span_w:.2f}%'>"
                f"</div><span class=ms style='left:{min(left + span_w, 88):.2f}%'>"
                f"{ms:.1f} ms</span></div></div>"
            )
            walk(s.context.span_id, depth + 1)

    walk(None, 0)
    trace_id = f"{group[0].context.trace_id:032x}"
    return f"""<!doctype html><meta charset=utf-8><style>
body {{ font: 13px system-ui, sans-serif; margin: 16px; color: #222; width: 1400px }}
h1 {{ font-size: 16px }} .row {{ display: flex; border-bottom: 1px solid #eee }}
.name {{ width: 620px; padding: 4px 8px 4px 0 }} .lane {{ flex: 1; position: relative }}
.bar {{ position: absolute; top: 9px; height: 14px; background: #3b82f6; border-radius: 2px }}
.error .bar {{ background: #dc2626 }} .error b {{ color: #b91c1c }}
.ms {{ position: absolute; top: 8px; padding-left: 6px; color: #555; font-size: 12px }}
.tag {{ display: inline-block; background: #f1f5f9; border-radius: 3px; padding: 0 4px;
  margin: 2px 3px 0 0; font-size: 11px; color: #334155 }} i {{ color: #64748b }}
</style><h1>synckit demo: trace {trace_id} ({len(group)} spans,
{width / 1e6:.0f} ms)</h1>{"".join(rows)}"""


def main() -> None:
    group = pick(collect())
    page_html = render(group)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1440, "height": 400})
        page.set_content(page_html)
        page.screenshot(path=str(OUT), full_page=True)
        browser.close()
    print(f"{OUT}: {len(group)} spans", file=sys.stderr)


if __name__ == "__main__":
    main()
