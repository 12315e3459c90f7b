"""Records declarations and the schema plan: pure functions of a model (no database)."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal
from enum import Enum
from typing import Literal

import pytest
from pydantic import BaseModel, Field, field_validator

from synckit import ConfigurationError, Connector, Page, Records, Stream
from synckit.errors.exceptions import RecordsSchemaError
from synckit.store.records.schema import plan_upgrade


class Colour(Enum):
    RED = "red"


class Address(BaseModel):
    city: str


class Row(BaseModel):
    id: str
    n: int
    price: float
    paid: bool = False
    at: datetime = Field(alias="createdAt")
    amount: Decimal | None = None
    colour: Colour = Colour.RED
    kind: Literal["a", "b"] = "a"
    address: Address | None = None
    tags: list[str] = []


def test_columns_are_typed_from_the_fields_nested_values_as_json() -> None:
    spec = Records(Row, table="rows").spec
    kinds = {c.name: (c.kind, c.nullable) for c in spec.columns}
    assert kinds == {
        "id": ("text", False),
        "n": ("int", False),
        "price": ("float", False),
        "paid": ("bool", True),
        "at": ("timestamp", False),
        "amount": ("decimal", True),
        "colour": ("text", True),
        "kind": ("text", True),
        "address": ("json", True),
        "tags": ("json", True),
    }
    assert spec.column("at").alias == "createdAt" and spec.key == ("id",)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"table": "Bad-Name"}, "records table name 'Bad-Name'"),
        ({"table": "rows", "key": "missing"}, "key field 'missing' is not a field"),
        ({"table": "rows", "key": "amount"}, "key field 'amount' must be a required"),
    ],
)
def test_a_declaration_that_cannot_work_is_refused_by_name(
    kwargs: dict[str, str], message: str
) -> None:
    with pytest.raises(ConfigurationError, match=message):
        Records(Row, **kwargs)  # type: ignore[arg-type]


def test_a_field_named_like_synckits_columns_is_refused() -> None:
    class Bad(BaseModel):
        id: str
        tenant: str

    with pytest.raises(ConfigurationError, match="field 'tenant' of Bad is a name synckit uses"):
        Records(Bad, table="bad")


def test_a_stream_with_records_needs_no_handle_and_a_table_is_declared_once() -> None:
    class Ok(Connector):
        name = "ok"
        streams = (Stream("rows", records=Records(Row, table="rows")),)

        async def poll(self, ctx, checkpoint):  # type: ignore[no-untyped-def]
            yield Page([])

    assert not Ok.handles()
    with pytest.raises(ConfigurationError, match="records table 'rows' is declared by streams"):

        class Twice(Connector):
            name = "twice"
            streams = (
                Stream("a", records=Records(Row, table="rows")),
                Stream("b", records=Records(Row, table="rows")),
            )

            async def poll(self, ctx, checkpoint):  # type: ignore[no-untyped-def]
                yield Page([])


def test_page_sweep_needs_the_full_sync_it_completes() -> None:
    with pytest.raises(TypeError, match="needs full_sync"):
        Page([], sweep=True)


def _recorded(model: type[BaseModel]) -> list[dict[str, object]]:
    return Records(model, table="rows").spec.as_json()


def test_plan_adds_new_optional_fields_and_refuses_what_it_cannot_apply() -> None:
    class V2(Row):
        note: str | None = None

    class TypeChanged(Row):
        n: str  # type: ignore[assignment]

    class NewRequired(Row):
        region: str

    class Required(Row):
        paid: bool  # type: ignore[assignment]

    class Removed(BaseModel):
        id: str
        price: float
        at: datetime

    spec = Records(V2, table="rows").spec
    assert [c.name for c in plan_upgrade(spec, None)] == [c.name for c in spec.columns]
    assert [c.name for c in plan_upgrade(spec, _recorded(Row))] == ["note"]
    assert plan_upgrade(Records(Row, table="rows").spec, _recorded(V2)) == []  # kept
    for model, message in (
        (TypeChanged, "field 'n' changed type \\(int -> text\\)"),
        (NewRequired, "new field 'region' is required"),
        (Required, "field 'paid' became required"),
        (Removed, "required field 'n' was removed"),
    ):
        with pytest.raises(RecordsSchemaError, match=message) as caught:
            plan_upgrade(Records(model, table="rows").spec, _recorded(Row))
        assert "\n" not in str(caught.value) and "'rows'" in str(caught.value)


class Upper(BaseModel):
    id: str
    name: str

    @field_validator("name")
    @classmethod
    def _count(cls, v: str) -> object:
        return len(v)  # a validator may give a str field something else


def test_row_values_are_the_columns_values_text_converted_only_where_it_may_not_be_text() -> None:
    """A page's rows (validated in one call) hold each column's stored value: an enum's
    text, JSON text for nested values, a number where a validator made one of a str
    field; a str field with no validator keeps its str."""
    from synckit.runtime.sync.records import prepare

    raw = {"id": "r1", "n": 1, "price": 2, "createdAt": "2026-01-01T00:00:00", "tags": ["x"]}
    landing, failures, _ = prepare(
        Records(Row, table="rows"), "t", "s", [raw, {**raw, "id": "r2"}], lambda r, e: e
    )
    assert not failures
    names = [c.name for c in Records(Row, table="rows").spec.columns]
    row = dict(zip(names, landing.batches[0].rows[0], strict=True))
    assert row["id"] == "r1" and row["colour"] == "red" and row["tags"] == '["x"]'
    assert row["at"] == datetime(2026, 1, 1, tzinfo=UTC) and row["price"] == 2.0
    landing, _, _ = prepare(
        Records(Upper, table="uppers"), "t", "s", [{"id": "a", "name": "abc"}], lambda r, e: e
    )
    assert landing.batches[0].rows == [("a", "3")]


def test_a_page_with_a_record_the_model_refuses_fails_that_one_naming_its_field() -> None:
    """Validated in one call, a page with a refused record is validated record by record:
    the others become rows in order, the refused one a failure naming the field."""
    from synckit.runtime.sync.records import prepare

    good = {"id": "r1", "n": 1, "price": 2, "createdAt": "2026-01-01T00:00:00"}
    page = [good, {**good, "id": "r2", "n": "many"}, {**good, "id": "r3"}]
    landing, failures, failed = prepare(
        Records(Row, table="rows"), "t", "s", page, lambda r, e: (r["id"], str(e))
    )
    assert [r[0] for r in landing.batches[0].rows] == ["r1", "r3"] and failed == [1]
    assert failures[0][0] == "r2" and "n: Input should be a valid integer" in failures[0][1]
