"""The console's queue pages: jobs (filtered, paged, one job's history and its actions),
dead letters (filtered, grouped, replayed, exported), the outbox and the workers."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

import structlog
from starlette.requests import Request
from starlette.responses import (
    PlainTextResponse,
    Response,
    StreamingResponse,
)

from synckit.clock import parse_duration, utcnow
from synckit.errors.exceptions import DeadLetterNotFound, JobNotFound, SynckitError, TenantNotFound
from synckit.printable import printable
from synckit.runtime.admin import tenants as tenant_store
from synckit.runtime.observe.logging import redact
from synckit.runtime.writes import outbox as outbox_store
from synckit.store import console, pages
from synckit.store import workers as worker_store
from synckit.store.db import Database
from synckit.store.dead_letters import reads as dlq_reads
from synckit.store.dead_letters import replay as dlq_replay
from synckit.store.dead_letters import rows as dlq_rows
from synckit.store.dead_letters.rows import DlqFilter
from synckit.store.jobs import admin as job_admin
from synckit.web.attempts import run_label, uncounted_runs
from synckit.web.paging import INTERNAL_KINDS

if TYPE_CHECKING:
    pass
from synckit.web.base import (
    JOB_STATUSES,
    OUTBOX_STATUSES,
    BadFilter,
    ConsoleState,
    act,
    cursor_links,
    failed,
    here_of,
    ids_of,
    int_param,
    next_query,
    query_values,
    red,
    render,
    row_or_404,
    since_param,
    state_of,
    who_of,
)

log = structlog.get_logger("synckit.web")
Handler = Callable[[Request], Awaitable[Response]]


# --- jobs -------------------------------------------------------------------------------


def _job_filter(request: Request) -> job_admin.JobFilter:
    q = request.query_params
    resource_key = q.get("resource") or None
    return job_admin.JobFilter(
        kind=q.get("kind") or None,
        status=q.get("status") or None,
        resource_key=resource_key,
        created_since=since_param(q.get("since")),
        hidden_kinds=() if q.get("internal") else INTERNAL_KINDS,
    )


def _refusing_bad_filter(
    template: str, statuses: Sequence[str], here: str
) -> Callable[[Handler], Handler]:
    """The page, or where its filter cannot be read (it raised :class:`BadFilter`) the
    page with nothing listed and the filter named (:func:`_refused_filter`)."""

    def wrap(page: Handler) -> Handler:
        @functools.wraps(page)
        async def run(request: Request) -> Response:
            try:
                return await page(request)
            except BadFilter as exc:
                return _refused_filter(request, template, exc, statuses=statuses, here=here)

        return run

    return wrap


@_refusing_bad_filter("jobs.html", JOB_STATUSES, "/jobs")
async def jobs_page(request: Request) -> Response:
    db = state_of(request).database
    q = request.query_params
    flt = _job_filter(request)
    if q.get("tenant") and not flt.resource_key:
        try:
            t = await tenant_store.get_tenant(db, q["tenant"], reveal=False)
        except TenantNotFound:
            # Named, not queried: the old sentinel key ("\x00...") was a driver error on
            # PostgreSQL, whose text cannot hold a NUL.
            raise BadFilter(f"no tenant {q['tenant']!r}") from None
        flt = dataclasses.replace(flt, resource_key=t.resource_key)
    page = await job_admin.job_page(db, flt, before_id=int_param(q.get("before")))
    return render(
        request,
        "jobs.html",
        page=page,
        scan_window=pages.SCAN_WINDOW,
        statuses=JOB_STATUSES,
        filters={
            k: q.get(k, "") for k in ("kind", "status", "tenant", "resource", "since", "internal")
        },
        total=await job_admin.count_jobs(db, flt),
        hidden=flt.hides,
        show_internal=urlencode(
            [(k, v) for k, v in q.multi_items() if k not in ("before", "back") and v]
            + [("internal", "1")]
        ),
        **cursor_links(request, "before", page.next_cursor),
        here=here_of(request),
    )


async def job_page(request: Request) -> Response:
    info = await row_or_404(request, "job_id", job_admin.get_job, JobNotFound, "job")
    if isinstance(info, Response):
        return info
    limit = state_of(request).limit_of(info.kind, info.max_attempts)
    timeline: list[tuple[str, datetime | None, str]] = [("created", info.created_at, "")]
    labels = [run_label(e, i, limit) for i, e in enumerate(info.errors, 1)]
    for e, label in zip(info.errors, labels, strict=True):
        timeline.append(
            (
                label,
                _parse_at(e.get("at")),
                f"{e.get('error_class', '')}: {e.get('message', e.get('error', ''))}",
            )
        )
    if info.finished_at:
        timeline.append((info.status, info.finished_at, ""))
    return render(
        request,
        "job.html",
        job=info,
        limit=limit,
        uncounted=uncounted_runs(info.errors),
        labels=labels,
        timeline=timeline,
    )


def _parse_at(value: Any) -> datetime | None:
    if isinstance(value, datetime):
        return value
    if isinstance(value, str):
        with contextlib.suppress(ValueError):
            return datetime.fromisoformat(value)
    return None


async def jobs_action(request: Request) -> Response:
    db = state_of(request).database
    form = await request.form()
    action = str(form.get("action") or "")
    ids = ids_of(form)
    default = "/jobs"

    async def work() -> str:
        if not ids:
            raise ValueError("no job selected")
        change: Callable[[int], Awaitable[Any]]
        if action == "retry":
            change = lambda i: job_admin.retry_job(db, i)  # noqa: E731
        elif action == "cancel":
            change = lambda i: job_admin.cancel_job(  # noqa: E731
                db, i, f"cancelled in the console by {who_of(request)}"
            )
        elif action == "reschedule":
            delay = parse_duration(str(form.get("delay") or "0"))
            when = utcnow() + delay
            change = lambda i: job_admin.reschedule_job(db, i, when)  # noqa: E731
        elif action == "priority":
            priority = int_param(form.get("priority"))
            if priority is None:
                raise ValueError("priority must be a whole number")
            # Its range is set_priority's to check (a refusal per job, named).
            change = lambda i: job_admin.set_priority(db, i, priority)  # noqa: E731
        else:
            raise ValueError(f"unknown job action {action!r}")
        done, refused = [], []
        for i in ids:
            try:
                await change(i)
                done.append(i)
            except SynckitError as exc:
                refused.append(f"{i}: {exc}")
        text = f"{action}: {len(done)} job(s) done"
        if refused:
            text += f"; {len(refused)} refused ({'; '.join(refused[:5])})"
        return failed(text) if refused else text

    return await act(request, f"jobs.{action}", ",".join(map(str, ids[:20])), work, default=default)


# --- dead letters -----------------------------------------------------------------------


def _dlq_filter(params: Any) -> DlqFilter:
    def many(name: str) -> tuple[str, ...]:
        values = params.getlist(name) if hasattr(params, "getlist") else [params.get(name)]
        return tuple(v for v in values if v)

    return DlqFilter(
        tenants=many("tenant"),
        error_classes=many("class"),
        kinds=many("kind"),
        statuses=tuple(s for s in many("status") if s in dlq_rows.STATUSES),
        since=since_param(params.get("since")),
    )


def _refused_filter(request: Request, template: str, exc: BadFilter, **values: Any) -> Response:
    """The page with nothing listed and the unreadable filter named, answered 400."""
    q = request.query_params
    empty: pages.Page[Any] = pages.Page([], None)
    return render(
        request,
        template,
        status_code=400,
        problem=str(exc),
        page=empty,
        groups=empty,
        groups_next=None,
        next_query=None,
        prev_query=None,
        total=None,
        hidden=(),
        export_query="",
        scan_window=pages.SCAN_WINDOW,
        filters={
            k: q.get(k, "") for k in ("kind", "status", "tenant", "resource", "since", "class")
        },
        **values,
    )


@_refusing_bad_filter("dlq.html", dlq_rows.STATUSES, "/dlq")
async def dlq_page(request: Request) -> Response:
    db = state_of(request).database
    q = request.query_params
    flt = _dlq_filter(q)
    open_flt = flt if flt.statuses else flt.narrowed(("pending", "review"))
    groups = await dlq_reads.dlq_groups(
        db,
        open_flt,
        after=q.get("groups_after") or None,
        recent_since=utcnow() - timedelta(hours=24),
    )
    page = await dlq_reads.dlq_page(db, flt, before_id=int_param(q.get("before")))
    # Every matching row, for the actions on all of them (only once a filter narrows
    # them: acting on the whole table is not one click away).
    matching = await dlq_reads.count(db, flt) if not flt.is_empty else None
    return render(
        request,
        "dlq.html",
        matching=matching,
        scan_window=pages.SCAN_WINDOW,
        groups=groups,
        groups_next=next_query(request, "groups_after", groups.next_cursor),
        page=page,
        statuses=dlq_rows.STATUSES,
        filters={k: q.get(k, "") for k in ("tenant", "class", "kind", "status", "since")},
        total=await console.dlq_total(db, flt),
        **cursor_links(request, "before", page.next_cursor),
        export_query=urlencode(
            {k: v for k, v in q.items() if k not in ("before", "groups_after") and v}
        ),
        here=here_of(request),
    )


async def dlq_row_page(request: Request) -> Response:
    row = await row_or_404(request, "row_id", dlq_reads.get, DeadLetterNotFound, "dead letter")
    if isinstance(row, Response):
        return row
    return render(request, "dlq_row.html", row=row)


async def dlq_action(request: Request) -> Response:
    st = state_of(request)
    db = st.database
    form = await request.form()
    action = str(form.get("action") or "")
    ids = ids_of(form)
    group_tenant = form.get("group_tenant")
    group_class = form.get("group_class")
    problem: str | None = None
    try:
        shown = _dlq_filter(form)  # the page's filter, which every group and row obeys
    except BadFilter as exc:
        shown, problem = DlqFilter(), str(exc)
    expected = int_param(form.get("expected"))
    if ids:
        flt = DlqFilter(ids=tuple(ids))
        target = "ids " + ",".join(map(str, ids[:20]))
    elif isinstance(group_tenant, str) and isinstance(group_class, str):
        # The group as the page showed it: its tenant and class within the page's filter
        # (kind, status, within), open rows unless a status was chosen.
        flt = dataclasses.replace(
            shown if shown.statuses else shown.narrowed(("pending", "review")),
            tenants=(group_tenant,),
            error_classes=(group_class,),
        )
        target = f"group {group_tenant or '(none)'}/{group_class}"
    elif form.get("scope") == "filter" and not shown.is_empty:
        flt = shown
        target = "filter " + urlencode(
            {
                k: v
                for k, v in form.multi_items()
                if k in ("tenant", "class", "kind", "status", "since")
            }
        )
    else:
        flt = DlqFilter()
        target = "nothing"

    async def work() -> str:
        if problem is not None:
            raise ValueError(problem)
        if flt.is_empty:
            raise ValueError("no dead letter selected")
        if expected is not None and not ids:
            now_matching = await dlq_reads.count(db, flt)
            if now_matching != expected:
                return failed(
                    f"nothing done: {now_matching} row(s) match now, not the {expected} shown "
                    "(the rows changed meanwhile); look again and repeat"
                )
        reason = f"{action} in the console by {who_of(request)}"
        if action == "resolve":
            n = await dlq_replay.resolve_matching(db, flt, reason=reason, now=utcnow())
            return f"{n} dead letter(s) resolved"
        if action == "ignore":
            n = await dlq_replay.ignore_matching(db, flt, reason=reason, now=utcnow())
            return f"{n} dead letter(s) ignored"
        if action == "replay":
            text, bad = replay_message(await _replay(st, db, flt))
            return failed(text) if bad else text
        raise ValueError(f"unknown dead-letter action {action!r}")

    return await act(request, f"dlq.{action}", target, work, default="/dlq")


def replay_message(summary: Any) -> tuple[str, bool]:
    """What a replay did, in words, outcome by outcome with the reasons; and whether it
    reads as a failure (rows left unchanged because of configuration, or nothing run)."""
    from synckit.dlq.replay import ReplaySummary

    assert isinstance(summary, ReplaySummary)
    if not summary.claimed:
        return "replay: no pending or review dead letter matched: nothing to replay", True
    words = {
        "resolved": "replayed and resolved",
        "not_rerun": "resolved without re-run",
        "retry": "failed again, retry scheduled",
        "review": "failed again, sent to review",
        "ignored": "ignored",
        "deferred": "deferred",
        "skipped": "not replayed",
        "blocked": "NOT replayed, left unchanged",
    }
    why: dict[str, list[str]] = {}
    for (outcome, reason), n in sorted(summary.reasons.items(), key=lambda kv: -kv[1]):
        why.setdefault(outcome, []).append(f"{n}: {red(reason)}" if n > 1 else red(reason))
    parts = []
    for outcome, word in words.items():
        n = getattr(summary, outcome)
        if n:
            reasons = why.get(outcome, [])
            shown = f" ({'; '.join(reasons[:3])}{'; ...' if len(reasons) > 3 else ''})"
            parts.append(f"{n} {word}{shown if reasons else ''}")
    settled = summary.resolved + summary.not_rerun + summary.retry + summary.review
    bad = bool(summary.blocked) or not (settled + summary.ignored + summary.deferred)
    return f"replay of {summary.claimed} dead letter(s): " + "; ".join(parts), bad


async def _replay(st: ConsoleState, db: Database, flt: DlqFilter) -> Any:
    """What ``synckit dlq replay`` does: with the App, its replayers; without, dead jobs
    are re-run and record rows are skipped as needing the App."""
    from synckit.dlq.replay import ReplayProcessor, replayers_from_app
    from synckit.runtime.admin.actions import NO_APP_REASON

    if st.config.app is None:
        processor = ReplayProcessor(
            db, missing_replayer="skip", skip_reason=NO_APP_REASON, timeout=60.0
        )
    else:
        replayers, registry = replayers_from_app(st.config.app, db)
        processor = ReplayProcessor(db, replayers, registry=registry, timeout=60.0)
    return await processor.replay_matching(flt)


async def dlq_export(request: Request) -> Response:
    """Matching rows as JSON lines, streamed page by page, secrets redacted."""
    db = state_of(request).database
    try:
        flt = _dlq_filter(request.query_params)
    except BadFilter as exc:
        return PlainTextResponse(printable(str(exc)), status_code=400)
    log.info("web.export", what="dlq", who=who_of(request))

    async def lines() -> AsyncIterator[bytes]:
        async for row in dlq_reads.iter_rows(db, flt, full=True):
            yield (json.dumps(redact(row.to_json()), sort_keys=True, default=str) + "\n").encode()

    return StreamingResponse(
        lines(),
        media_type="application/x-ndjson",
        headers={"Content-Disposition": 'attachment; filename="dead-letters.jsonl"'},
    )


# --- outbox -----------------------------------------------------------------------------


async def outbox_page(request: Request) -> Response:
    db = state_of(request).database
    q = request.query_params
    status, topic, key = query_values(request, "status", "topic", "key")
    before_id = int_param(q.get("before"))
    page = await console.outbox_page(db, status=status, topic=topic, key=key, before_id=before_id)
    return render(
        request,
        "outbox.html",
        page=page,
        topics=await console.outbox_topics(db),
        counts=await outbox_store.count_by_status(db),
        statuses=OUTBOX_STATUSES,
        filters={k: q.get(k, "") for k in ("status", "topic", "key")},
        total=await console.outbox_total(db, status=status, topic=topic, key=key),
        **cursor_links(request, "before", page.next_cursor),
        here=here_of(request),
    )


async def outbox_action(request: Request) -> Response:
    db = state_of(request).database
    form = await request.form()
    ids = ids_of(form)
    topic = form.get("topic")

    async def work() -> str:
        if ids:
            n = await outbox_store.retry_messages(db, ids)
        elif isinstance(topic, str) and topic:
            n = await outbox_store.retry_failed(db, topic=topic)
        else:
            raise ValueError("no message selected")
        return f"{n} outbox message(s) back to pending"

    target = ",".join(map(str, ids[:20])) if ids else f"topic {topic}"
    return await act(request, "outbox.retry", target, work, default="/outbox")


# --- workers ----------------------------------------------------------------------------


async def _workers_values(request: Request) -> dict[str, Any]:
    found = await worker_store.list_workers(state_of(request).database, now=utcnow())
    return {"workers": found, "alive": sum(1 for w in found if w.state == "alive")}


async def workers_page(request: Request) -> Response:
    return render(request, "workers.html", **await _workers_values(request))


async def workers_live(request: Request) -> Response:
    return render(request, "_workers_live.html", **await _workers_values(request))
