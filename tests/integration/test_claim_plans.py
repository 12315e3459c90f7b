"""The claim queries walk the due indexes in claim order, on SQLite and PostgreSQL.

A claim must cost about the same with 100 or 100,000 jobs waiting. The failure this
guards against is silent: SQLite once answered every claim from an index led by
``status``, which meant fetching every pending row and sorting them all, per claim.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from synckit.store import outbox, resources
from synckit.store.db import Database
from synckit.store.jobs import claiming, enqueueing

NOW = datetime(2026, 11, 22, tzinfo=UTC)
PARAMS: dict[str, Any] = {
    "now": NOW,
    "lim": 100,
    "worker": "w",
    "token": 1,
    "until": NOW + timedelta(minutes=1),
    "charge": 0,
    "started": None,
    "lane": "tenant-1",
}


async def plan(conn: AsyncConnection, stmt: Any, **params: Any) -> str:
    """The engine's plan for ``stmt`` with :data:`PARAMS` (and ``params``) bound, as one
    string."""
    compiled = stmt.compile(dialect=conn.dialect)
    values = compiled.construct_params({**PARAMS, **params})
    processors = compiled._bind_processors
    ordered = tuple(
        processors[name](values[name]) if name in processors else values[name]
        for name in compiled.positiontup
    )
    prefix = "EXPLAIN QUERY PLAN " if conn.dialect.name == "sqlite" else "EXPLAIN "
    rows = (await conn.exec_driver_sql(prefix + compiled.string, ordered)).all()
    return "\n".join(" ".join(str(c) for c in r) for r in rows)


async def backlog(db: Database, rows: int) -> None:
    """``rows`` pending jobs, half of them in lanes."""
    if db.is_postgres:
        sql = (
            "INSERT INTO jobs (kind, payload, status, run_at, created_at, updated_at,"
            " resource_key) SELECT 'k', '{}', 'pending', now(), now(), now(),"
            " CASE WHEN g % 2 = 0 THEN 'tenant-' || (g % 10) END"
            " FROM generate_series(1, :n) g"
        )
    else:
        sql = (
            "WITH RECURSIVE s(g) AS (SELECT 1 UNION ALL SELECT g + 1 FROM s WHERE g < :n)"
            " INSERT INTO jobs (kind, payload, status, run_at, created_at, updated_at,"
            " resource_key) SELECT 'k', '{}', 'pending', '2026-01-01', '2026-01-01',"
            " '2026-01-01', CASE WHEN g % 2 = 0 THEN 'tenant-' || (g % 10) END FROM s"
        )
    async with db.begin() as conn:
        await conn.execute(text(sql), {"n": rows})
        if db.is_postgres:
            # autovacuum would; SQLite users rarely run ANALYZE, so its plan must be
            # right without statistics.
            await conn.execute(text("ANALYZE jobs"))


async def test_claims_walk_the_due_indexes(db: Database) -> None:
    await backlog(db, 20_000)
    async with db.begin() as conn:
        unkeyed = await plan(conn, claiming._CLAIM_UNKEYED)
        keyed = await plan(conn, claiming._CLAIM_KEYED)
        lanes = await plan(conn, claiming._LANES)
    assert "ix_jobs_due" in unkeyed, unkeyed
    assert "ix_jobs_lane_due" in keyed, keyed
    if not db.is_postgres:
        # No sort of the backlog: the index gives the claim order.
        assert "TEMP B-TREE" not in unkeyed, unkeyed
        assert "TEMP B-TREE" not in keyed, keyed
        # The marked lanes in fairness order, a capped lane's running jobs counted from
        # their partial index.
        assert "ix_resources_lanes" in lanes and "ix_jobs_running" in lanes, lanes
        assert "TEMP B-TREE" not in lanes, lanes


async def test_sqlite_claims_one_job_of_many_lanes_by_their_due_index(db: Database) -> None:
    """SQLite claims the first job of each of many lanes in one statement: one probe of
    ix_jobs_lane_due per lane, no scan or sort of the backlog; and it claims what the
    per-lane claims would (each lane's first due job by priority, then run_at, then id)."""
    if db.is_postgres:
        pytest.skip("PostgreSQL claims many lanes in one statement of its own (LATERAL)")
    await backlog(db, 20_000)
    lanes = json.dumps([f"tenant-{i}" for i in range(10)])
    async with db.begin() as conn:
        ones = await plan(conn, claiming._CLAIM_ONES_SQLITE, lanes=lanes)
    assert "SEARCH j USING COVERING INDEX ix_jobs_lane_due" in ones or (
        "SEARCH j USING INDEX ix_jobs_lane_due" in ones
    ), ones
    assert "TEMP B-TREE" not in ones and "SCAN j" not in ones, ones
    # What it claims: each lane's first due job, by priority, then run_at, then id.
    async with db.begin() as conn:
        await conn.execute(text("DELETE FROM jobs"))
    ids: dict[str, int] = {}
    for lane, priority, delay in [
        ("a", 0, 0), ("a", 0, 0), ("b", 0, 0), ("b", 5, 0), ("c", 9, 3600), ("c", 0, 0),
        ("d", 0, 3600),
    ]:  # fmt: skip
        job = await enqueueing.enqueue(
            db, "k", resource_key=lane, priority=priority,
            run_at=NOW + timedelta(seconds=delay), now=NOW,
        )  # fmt: skip
        job_id = job.id
        if delay == 0 and (lane not in ids or priority > 0):
            ids[lane] = job_id
    # Three due lanes, three jobs: one each (lane d's job is not due).
    claimed = await claiming.claim(db, "w", 3, now=NOW)
    assert sorted((j.resource_key, j.id) for j in claimed) == sorted(ids.items())


async def tenants_with_work(db: Database, tenants: int, busy: int) -> None:
    """``tenants`` resources with a connection each, the first ``busy`` of them with a
    pending job and their lane marked (as an enqueue leaves them), the next one paused;
    and 20,000 finished jobs, as a long-lived table holds."""
    if db.is_postgres:
        series = "generate_series(1, :n) g"
        stamp = "now()"
    else:
        series = "(WITH RECURSIVE s(g) AS (SELECT 1 UNION ALL SELECT g + 1 FROM s WHERE g < :n)"
        series += " SELECT g FROM s)"
        stamp = "'2026-01-01 00:00:00.000000'"
    key = "'tenant-' || g"
    statements = [
        "INSERT INTO resources (resource_key, state, updated_at, due_at)"
        f" SELECT {key}, 'closed', {stamp}, CASE WHEN g <= :busy THEN {stamp} END FROM {series}",
        "INSERT INTO connections (tenant, connector, resource_key, status, created_at,"
        f" updated_at) SELECT {key}, 'c', {key}, CASE WHEN g = :busy + 1 THEN 'paused'"
        f" ELSE 'active' END, {stamp}, {stamp} FROM {series}",
        "INSERT INTO jobs (kind, payload, status, run_at, created_at, updated_at, resource_key)"
        f" SELECT 'k', '{{}}', CASE WHEN g <= :busy THEN 'pending' ELSE 'succeeded' END,"
        f" {stamp}, {stamp}, {stamp}, {key} FROM {series}",
    ]
    async with db.begin() as conn:
        for sql in statements:
            await conn.execute(text(sql), {"n": tenants, "busy": busy})
        await conn.execute(
            text(
                "INSERT INTO jobs (kind, payload, status, run_at, created_at, updated_at)"
                f" SELECT 'old', '{{}}', 'succeeded', {stamp}, {stamp}, {stamp} FROM {series}"
            ),
            {"n": 20_000},
        )
        if db.is_postgres:
            # This schema's tables only: a bare ANALYZE reads every schema of the database,
            # other test processes' too, and deadlocked with one dropping its schema.
            await conn.execute(text("ANALYZE resources, connections, jobs"))


@pytest.mark.parametrize("busy", [50, 20_000])
async def test_the_lanes_query_reads_the_marked_lanes_not_every_resource(
    db: Database, busy: int
) -> None:
    """Of 20,000 tenants, with 50 or all of them having work: the lanes come from
    ix_resources_lanes, never a scan of resources, and each lane's parent and connection
    are one index probe, never a read of them all. With many lanes marked, the index's
    order serves the LIMIT: no sort."""
    await tenants_with_work(db, 20_000, busy)
    async with db.begin() as conn:
        lanes = await plan(conn, claiming._LANES, now=NOW + timedelta(days=3650), lim=32)
    assert "ix_resources_lanes" in lanes, lanes
    if db.is_postgres:
        assert "Seq Scan" not in lanes, lanes
        assert "Index Scan using pk_resources on resources parent" in lanes, lanes
        assert "Index Scan using ix_connections_resource_key on connections" in lanes, lanes
        if busy == 20_000:
            assert "Sort" not in lanes, lanes
    else:
        assert "SCAN resources USING INDEX ix_resources_lanes" in lanes, lanes
        assert "TEMP B-TREE" not in lanes, lanes
        assert "SEARCH parent USING INDEX" in lanes, lanes
        assert "SEARCH connections USING INDEX ix_connections_resource_key" in lanes, lanes
        scans = [line for line in lanes.splitlines() if " SCAN " in f" {line} "]
        assert all("USING INDEX ix_resources_lanes" in line for line in scans), lanes


async def test_a_claim_reads_its_batch_of_lanes_of_20000(db: Database) -> None:
    """Executed on PostgreSQL with 20,000 lanes due: the lanes query reads as many
    entries of ix_resources_lanes as lanes it returns; then a claim takes one job from
    each of 32 lanes."""
    await tenants_with_work(db, 20_000, 20_000)
    if db.is_postgres:
        async with db.begin() as conn:
            compiled = claiming._LANES.compile(dialect=conn.dialect)
            values = compiled.construct_params({"now": datetime.now(UTC), "lim": 32})
            ordered = tuple(values[name] for name in compiled.positiontup)
            rows = await conn.exec_driver_sql(
                "EXPLAIN (ANALYZE, FORMAT JSON) " + compiled.string, ordered
            )
            walk = _node(rows.scalar_one()[0]["Plan"], "ix_resources_lanes")
        assert walk["Node Type"] == "Index Scan", walk
        assert walk["Actual Rows"] + walk.get("Rows Removed by Filter", 0) == 32, walk
    claimed = await claiming.claim(db, "w", 32)
    assert len({j.resource_key for j in claimed}) == 32


def _node(plan: dict[str, Any], index: str) -> dict[str, Any]:
    """The first node of a JSON plan that reads ``index``, depth first."""
    if plan.get("Index Name") == index:
        return plan
    for child in plan.get("Plans", []):
        try:
            return _node(child, index)
        except LookupError:
            continue
    raise LookupError(index)


async def test_the_claims_lane_writes_use_keys_and_the_lane_index(db: Database) -> None:
    """What a claim writes on its lanes (last_claimed_at, the recomputed mark) finds them
    by primary key, and each lane's next due time by probes of ix_jobs_lane_due."""
    await tenants_with_work(db, 20_000, 20_000)
    lanes = ["tenant-1", "tenant-2"]
    async with db.begin() as conn:
        if db.is_postgres:
            params: dict[str, Any] = {"served": lanes, "short": lanes, "touched": lanes}
        else:
            params = {k: json.dumps(lanes) for k in ("served", "short", "touched")}
        after = await plan(conn, resources._AFTER_CLAIM[conn.dialect.name], **params)
    if db.is_postgres:
        assert "Seq Scan" not in after, after
        assert "pk_resources" in after and "ix_jobs_lane_due" in after, after
    else:
        assert "SEARCH resources USING INDEX" in after, after
        assert "SEARCH j USING INDEX ix_jobs_lane_due" in after, after
        assert not any(line.endswith(("SCAN jobs", "SCAN j")) for line in after.splitlines())


async def outbox_backlog(db: Database, rows: int) -> None:
    """``rows`` pending outbox messages over 50 keys, a few of them waiting for a retry."""
    if db.is_postgres:
        sql = (
            "INSERT INTO outbox (topic, key, payload, message_id, status, next_attempt_at,"
            " created_at) SELECT 't', (g % 50)::text, '{}', 'm' || g, 'pending',"
            " CASE WHEN g % 1000 = 0 THEN now() + interval '1 hour' ELSE now() END, now()"
            " FROM generate_series(1, :n) g"
        )
    else:
        sql = (
            "WITH RECURSIVE s(g) AS (SELECT 1 UNION ALL SELECT g + 1 FROM s WHERE g < :n)"
            " INSERT INTO outbox (topic, key, payload, message_id, status, next_attempt_at,"
            " created_at) SELECT 't', CAST(g % 50 AS TEXT), '{}', 'm' || g, 'pending',"
            " CASE WHEN g % 1000 = 0 THEN '2099-01-01' ELSE '2026-01-01' END, '2026-01-01'"
            " FROM s"
        )
    async with db.begin() as conn:
        await conn.execute(text(sql), {"n": rows})
        if db.is_postgres:
            await conn.execute(text("ANALYZE outbox"))


async def test_the_outbox_claim_reads_about_a_batch_whatever_the_backlog(db: Database) -> None:
    """Pending messages in id order from their partial index; waiting keys through
    next_attempt_at; each key's first blocker by one probe of (key, id)."""
    await outbox_backlog(db, 20_000)
    async with db.begin() as conn:
        claim = await plan(conn, outbox._claim_statement(datetime.now(UTC), 500))
        if db.is_postgres:
            ids: Any = [1, 2]
            keys: Any = ["1", "2"]
        else:
            ids, keys = "[1, 2]", '["1", "2"]'
        blockers = await plan(conn, outbox._BLOCKERS[conn.dialect.name], ids=ids, keys=keys)
    assert "ix_outbox_pending_id" in claim, claim
    # PostgreSQL may walk pending ids until a key turns up instead, when keys are as
    # evenly spread as here; either way no whole scan.
    assert "Seq Scan" not in blockers and "SCAN o\n" not in blockers + "\n", blockers
    if not db.is_postgres:
        assert "ix_outbox_pending_key" in blockers, blockers
        # The waiting keys through next_attempt_at, not a walk of every keyed message.
        assert "ix_outbox_pending (next_attempt_at>?)" in claim, claim
        assert "SCAN outbox USING INDEX ix_outbox_pending_key" not in claim, claim
        assert "TEMP B-TREE FOR ORDER BY" not in claim, claim


async def test_no_statement_of_synckit_is_jit_compiled_on_postgresql(
    db: Database, migrated_url: str
) -> None:
    """PostgreSQL compiles a statement whose estimated cost passes ``jit_above_cost``
    (100,000 by default): a claim's lane update of 64 lanes passed it (its correlated
    next-due subquery is costed high), and each claim then spent ~8 ms compiling a
    statement that ran in 0.4 ms. synckit's connections have JIT off; a plain
    connection to the same server, for comparison, compiles it."""
    if not db.is_postgres:
        pytest.skip("JIT is PostgreSQL's")
    await tenants_with_work(db, 2_000, 2_000)
    lanes = [f"tenant-{i}" for i in range(1, 65)]
    stmt = resources._AFTER_CLAIM["postgresql"].text.replace(":now", "now()")
    for name in ("served", "short", "touched"):
        stmt = stmt.replace(f":{name}", f"${('served', 'short', 'touched').index(name) + 1}")
    explain = "EXPLAIN (ANALYZE, FORMAT TEXT) " + stmt

    async def plan_of(conn: Any) -> str:
        await conn.execute("SET jit_above_cost = 0")  # whatever the estimate
        rows = await conn.fetch(explain, lanes, lanes, lanes)
        return "\n".join(r[0] for r in rows)

    async with db.begin() as conn:
        assert (await conn.execute(text("SHOW jit"))).scalar() == "off"
        raw = await conn.get_raw_connection()
        ours = await plan_of(raw.driver_connection)
        await conn.rollback()
    assert "JIT:" not in ours, ours

    import asyncpg

    url = db.engine.url
    schema = migrated_url.rsplit("search_path=", 1)[1]
    plain = await asyncpg.connect(
        host=url.host, port=url.port, user=url.username, database=url.database,
        server_settings={"search_path": schema},
    )  # fmt: skip
    try:
        async with plain.transaction():
            if await plain.fetchval("SELECT pg_jit_available()"):
                assert "JIT:" in await plan_of(plain)
            raise _Rollback
    except _Rollback:
        pass
    finally:
        await plain.close()


class _Rollback(Exception):
    pass


async def test_a_session_setting_the_server_refuses_leaves_the_connection_working(
    migrated_url: str, engine_name: str
) -> None:
    """A server that refuses a session setting (JIT's, before PostgreSQL 11) keeps the
    connection, and the settings after it still apply."""
    if engine_name != "postgresql":
        pytest.skip("PostgreSQL's session settings")
    from synckit.store import db as store_db
    from synckit.store.db import open_database

    d = open_database(migrated_url)
    try:
        # A second listener on the same engine: refused first, then JIT off again.
        store_db._install_pg_session(d.engine, ("SET no_such_setting = off", "SET jit = off"))
        async with d.begin() as conn:
            assert (await conn.execute(text("SHOW jit"))).scalar() == "off"
            assert (await conn.execute(text("SELECT count(*) FROM jobs"))).scalar() == 0
    finally:
        await d.dispose()


def _sql_literal(value: Any) -> str:
    """``value`` as a PostgreSQL literal, for ``EXECUTE name(...)``."""
    if value is None:
        return "NULL"
    if isinstance(value, bool | int):
        return str(int(value))
    if isinstance(value, datetime):
        return f"'{value.isoformat()}'"
    if isinstance(value, list):
        return "ARRAY[" + ", ".join(_sql_literal(v) for v in value) + "]"
    return "'" + str(value).replace("'", "''") + "'"


def _nodes(plan: dict[str, Any]) -> list[dict[str, Any]]:
    """Every node of a JSON plan, depth first."""
    return [plan, *(n for child in plan.get("Plans", []) for n in _nodes(child))]


async def test_a_claim_right_after_a_bulk_enqueue_locks_its_batch_once(db: Database) -> None:
    """Right after 100,000 jobs of one tenant are enqueued, with the statistics of before
    or after (autovacuum's ANALYZE) and with the plan PostgreSQL makes for the values or
    the generic one it keeps for a prepared statement after five runs, both claim forms
    (one lane; many lanes in one statement) lock each lane's batch once and read no whole
    table. As ``jobs.id IN (SELECT ... FOR UPDATE SKIP LOCKED)`` the generic plan hashed
    a scan of all of jobs per claim, and a claim in a test run spun for minutes; as a join
    with a MATERIALIZED CTE of the ids, the custom plan did. The ids are now an
    ``ARRAY(SELECT ...)`` run once, the jobs updated by primary key
    (:func:`~synckit.store.leases.picked`). SQLite: the one-lane claim walks the lane's
    index."""
    lanes = ["busy", "other"]
    if not db.is_postgres:
        await backlog(db, 100_000)
        async with db.begin() as conn:
            keyed = await plan(conn, claiming._CLAIM_KEYED, lane="tenant-2")
        assert "ix_jobs_lane_due" in keyed and "SCAN jobs\n" not in keyed + "\n", keyed
        return
    insert = (
        "INSERT INTO jobs (kind, payload, status, run_at, created_at, updated_at,"
        " resource_key) SELECT 'k', '{}', 'pending', now(), now(), now(),"
        " CASE WHEN g <= 100000 THEN 'busy' ELSE 'other' END FROM generate_series(1, 100010) g"
    )
    async with db.begin() as conn:
        await conn.execute(text(insert))
    now = datetime.now(UTC)
    params = {**PARAMS, "now": now, "until": now + timedelta(minutes=1), "wants": [100, 100]}
    forms = {
        "one lane": (claiming._CLAIM_KEYED, {"lane": "busy"}, 1),
        "many lanes": (claiming._CLAIM_LANES_PG, {"lanes": lanes}, len(lanes)),
    }
    for analyzed in (False, True):
        if analyzed:
            async with db.begin() as conn:
                await conn.execute(text("ANALYZE jobs"))
        for name, (stmt, extra, runs) in forms.items():
            compiled = stmt.compile(dialect=db.engine.dialect)
            values = compiled.construct_params({**params, **extra})
            args = ", ".join(_sql_literal(values[n]) for n in compiled.positiontup)
            for mode in ("force_custom_plan", "force_generic_plan"):
                async with db.begin() as conn:
                    await conn.exec_driver_sql(f"SET LOCAL plan_cache_mode = {mode}")
                    await conn.exec_driver_sql("PREPARE claim AS " + compiled.string)
                    explained = await conn.exec_driver_sql(
                        f"EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE claim({args})"
                    )
                    nodes = _nodes(explained.scalar_one()[0]["Plan"])
                    await conn.exec_driver_sql("DEALLOCATE claim")
                    await conn.rollback()
                case = f"{name}, {mode}, analyzed={analyzed}"
                locks = [n["Actual Loops"] for n in nodes if n["Node Type"] == "LockRows"]
                assert sum(locks) == runs, (case, nodes)
                read = [(n["Node Type"], n.get("Relation Name"), n["Actual Rows"]) for n in nodes]
                assert not any(node == "Seq Scan" for node, _, _ in read), (case, read)
                claimed = next(n for n in nodes if n["Node Type"] == "ModifyTable")
                assert claimed["Actual Rows"] == 100 + 10 * (runs - 1), (case, claimed)
