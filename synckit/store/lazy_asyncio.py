"""``sqlalchemy.ext.asyncio`` without the ORM until something asks for the ORM.

The store runs on SQLAlchemy Core through its asyncio extension (``AsyncEngine``,
``AsyncConnection``). The extension's package ``__init__`` also imports its session
modules, and with them all of ``sqlalchemy.orm``: about a third of the start-up of a
short command such as ``synckit status`` (issue 35), for classes the store never uses.

:func:`install` puts a finder on ``sys.meta_path`` for that one package. When it is first
imported, the package is made from SQLAlchemy's own files, but only its ``engine`` and
``result`` modules are run; the first access to any other name of the package
(``AsyncSession``, ``async_sessionmaker``, ...) runs the real ``__init__`` in the same
module, so code that uses the ORM sees the package exactly as SQLAlchemy ships it.
Importing a submodule directly (``sqlalchemy.ext.asyncio.session``) works as always.
The finder steps aside after that first import, or at once if the package is already
loaded. ``tests/unit/test_lazy_asyncio.py`` holds both halves.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
from types import ModuleType
from typing import TYPE_CHECKING, Any, TypeGuard

if TYPE_CHECKING:
    from collections.abc import Sequence

    from sqlalchemy.ext.asyncio import AsyncSession

__all__ = ["install", "is_async_session"]

PACKAGE = "sqlalchemy.ext.asyncio"
#: What the store uses, run at once: the package's names from these two modules.
_EAGER = {
    "engine": (
        "AsyncConnection",
        "AsyncEngine",
        "AsyncTransaction",
        "async_engine_from_config",
        "create_async_engine",
        "create_async_pool_from_url",
    ),
    "result": ("AsyncMappingResult", "AsyncResult", "AsyncScalarResult", "AsyncTupleResult"),
}


class _Loader(importlib.abc.Loader):
    def __init__(self, real: importlib.abc.Loader) -> None:
        self._real = real

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return None

    def exec_module(self, module: ModuleType) -> None:
        for name, names in _EAGER.items():
            submodule = importlib.import_module(f"{PACKAGE}.{name}")
            for attr in names:
                setattr(module, attr, getattr(submodule, attr))
        real = self._real

        def __getattr__(name: str) -> Any:
            # Anything else: run SQLAlchemy's own __init__ in this module, once.
            del module.__dict__["__getattr__"]
            real.exec_module(module)
            return getattr(module, name)

        module.__dict__["__getattr__"] = __getattr__


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != PACKAGE:
            return None
        _remove(self)
        real = importlib.util.find_spec(fullname)
        if real is None or real.loader is None or real.submodule_search_locations is None:
            return real
        spec = importlib.machinery.ModuleSpec(
            fullname, _Loader(real.loader), origin=real.origin, is_package=True
        )
        spec.submodule_search_locations = real.submodule_search_locations
        spec.has_location = real.has_location
        return spec


def _remove(finder: _Finder) -> None:
    if finder in sys.meta_path:
        sys.meta_path.remove(finder)


def install() -> None:
    """Put the finder in place, unless the package is loaded (or the finder is there)."""
    if PACKAGE in sys.modules or any(isinstance(f, _Finder) for f in sys.meta_path):
        return
    sys.meta_path.insert(0, _Finder())


def is_async_session(target: object) -> TypeGuard[AsyncSession]:
    """True for an ORM ``AsyncSession`` (which exists only once the ORM is loaded)."""
    session = sys.modules.get(f"{PACKAGE}.session")
    return session is not None and isinstance(target, session.AsyncSession)
