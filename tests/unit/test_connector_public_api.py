"""The public API: what `synckit` exports is importable and `__all__` is sorted."""

from __future__ import annotations

import synckit


def test_all_is_sorted_and_importable() -> None:
    """Every exported name exists, and __all__ keeps ruff's RUF022 order."""
    assert list(synckit.__all__) == sorted(
        synckit.__all__, key=lambda n: (not n.isupper(), not n[:1].isupper(), n)
    )
    for name in synckit.__all__:
        assert getattr(synckit, name) is not None


def test_connector_api_is_exported() -> None:
    """An integration engineer needs only `from synckit import ...`."""
    for name in ("App", "Connector", "Page", "RateLimit", "Stream", "SyncContext"):
        assert name in synckit.__all__
    for name in ("add_tenant", "list_tenants", "pause_tenant", "resume_tenant", "remove_tenant"):
        assert name in synckit.__all__


def test_all_is_complete() -> None:
    """Every name the package exports is in __all__ and resolves; nothing public is unlisted."""
    import types

    assert set(synckit._EXPORTS) == set(synckit.__all__)
    for name in synckit.__all__:
        assert getattr(synckit, name) is not None
    bound = {
        name
        for name, value in vars(synckit).items()
        if not name.startswith("_") and not isinstance(value, types.ModuleType)
    }
    assert bound <= set(synckit.__all__) | {"annotations", "importlib", "TYPE_CHECKING", "Any"}


def test_the_connect_flow_is_exported() -> None:
    """A web app connects a tenant with `from synckit import begin_authorization, ...`."""
    from synckit.runtime.credentials import authorize

    assert synckit.begin_authorization is authorize.begin_authorization
    assert synckit.complete_authorization is authorize.complete_authorization
    for name in ("begin_authorization", "complete_authorization", "reauth", "TokenSet"):
        assert name in synckit.__all__
