"""Which values of a tenant's config are secrets, and their sealed form at rest.

A connector's config model types its secrets (``SecretStr``, ``SecretBytes``,
``pydantic.Secret[...]``), at any depth: in nested models, dataclasses and TypedDicts,
in lists, tuples and dicts of them, behind ``Optional``/unions and ``Annotated``.
:func:`secret_paths` follows the model's field types through the config as given (JSON)
and names the path of every such value; by type, never by key name, so a ``SecretStr``
called ``pat`` or ``webhook_url`` is a secret like ``api_key``. Where a union leaves
the type open, a value that any member types as a secret is one: sealing too much
costs nothing, sealing too little leaks.

:func:`seal_config` replaces each of those values by the object
:meth:`~synckit.runtime.credentials.secrets.TokenCipher.seal_value` makes; :func:`open_config`
undoes it without the model (the stored object says what it is), and :func:`mask_config`
puts ``***`` in their place for display. All are pure: no I/O, the cipher is an argument.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from collections.abc import Mapping
from typing import Any, Union, get_args, get_origin

from pydantic import BaseModel
from pydantic import types as pydantic_types

from synckit.errors.exceptions import ConfigurationError, SecretCorrupt, SecretUnavailable
from synckit.runtime.credentials.secrets import TokenCipher, is_sealed_value

__all__ = [
    "MASK",
    "ConfigPath",
    "dotted",
    "mask_config",
    "open_config",
    "reseal_config",
    "seal_config",
    "secret_paths",
]

#: A value's place in a config: keys of objects and indexes of arrays.
ConfigPath = tuple[str | int, ...]

MASK = "***"
# Deeper than any real config; a hostile one is not walked further (and not stored: see
# tenants, which refuses configs that json cannot dump).
_MAX_DEPTH = 64

_SECRET_BASE: type = getattr(pydantic_types, "_SecretBase", pydantic_types.SecretStr)
_SEQUENCES = {list, tuple, set, frozenset}
_SEQUENCE_NAMES = {"Sequence", "MutableSequence", "Collection", "Iterable", "AbstractSet"}
_MAPPING_NAMES = {"Mapping", "MutableMapping"}


def dotted(path: ConfigPath) -> str:
    """``("auth", "keys", 0, "pat")`` as ``auth.keys[0].pat``."""
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else part)
    return out or "(config)"


def _unwrap(tp: Any) -> Any:
    while True:
        origin = get_origin(tp)
        if origin is typing.Annotated:
            tp = get_args(tp)[0]
        elif type(tp).__name__ == "TypeAliasType":  # `type X = ...` (Python 3.12+)
            tp = tp.__value__
        elif hasattr(tp, "__supertype__"):  # NewType
            tp = tp.__supertype__
        else:
            return tp


def _is_secret_type(tp: Any) -> bool:
    cls = get_origin(tp) or tp
    return isinstance(cls, type) and issubclass(cls, _SECRET_BASE)


def _fields(tp: Any) -> list[tuple[set[str], Any]] | None:
    """The fields of a model-like type: (keys it is read from, its type); None if not one."""
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        out: list[tuple[set[str], Any]] = []
        for name, f in tp.model_fields.items():
            keys = {name}
            for alias in (f.alias, f.validation_alias):
                if isinstance(alias, str):
                    keys.add(alias)
                elif alias is not None:  # AliasChoices / AliasPath: their first-level names
                    for choice in getattr(alias, "choices", [alias]):
                        first = getattr(choice, "path", [choice])[0]
                        if isinstance(first, str):
                            keys.add(first)
            out.append((keys, f.annotation))
        return out
    if isinstance(tp, type) and (dataclasses.is_dataclass(tp) or typing.is_typeddict(tp)):
        try:
            hints = typing.get_type_hints(tp, include_extras=True)
        except Exception:  # an unresolvable forward reference: by the raw annotations
            hints = dict(getattr(tp, "__annotations__", {}))
        return [({name}, hint) for name, hint in hints.items()]
    return None


def _walk(tp: Any, value: Any, path: ConfigPath, out: dict[ConfigPath, None], depth: int) -> None:
    if value is None or depth > _MAX_DEPTH:
        return
    if is_sealed_value(value):
        out[path] = None  # sealed already: a secret whatever the model says now
        return
    tp = _unwrap(tp)
    if _is_secret_type(tp):
        out[path] = None
        return
    origin = get_origin(tp)
    if origin is Union or origin is types.UnionType:
        for arg in get_args(tp):
            _walk(arg, value, path, out, depth + 1)
        return
    fields = _fields(tp)
    if fields is not None:
        if isinstance(value, Mapping):
            for keys, annotation in fields:
                for key in keys:
                    if key in value:
                        _walk(annotation, value[key], (*path, key), out, depth + 1)
        return
    args = get_args(tp)
    name = getattr(origin, "__name__", "")
    if isinstance(value, list) and (origin in _SEQUENCES or name in _SEQUENCE_NAMES):
        if origin is tuple and args and not (len(args) == 2 and args[1] is Ellipsis):
            pairs = list(zip(args, value, strict=False))
        else:
            pairs = [(args[0] if args else Any, v) for v in value]
        for i, (item_tp, item) in enumerate(pairs):
            _walk(item_tp, item, (*path, i), out, depth + 1)
    elif isinstance(value, Mapping) and (origin is dict or name in _MAPPING_NAMES):
        item_tp = args[1] if len(args) == 2 else Any
        for key, item in value.items():
            _walk(item_tp, item, (*path, key), out, depth + 1)


def secret_paths(model: type[BaseModel], config: Mapping[str, Any]) -> list[ConfigPath]:
    """The paths in ``config`` (a config as JSON) of every value ``model`` types as a
    secret, or that is sealed already; in document order."""
    out: dict[ConfigPath, None] = {}
    _walk(model, config, (), out, 0)
    return list(out)


def _copy(config: Mapping[str, Any]) -> dict[str, Any]:
    copied: dict[str, Any] = json.loads(json.dumps(config))
    return copied


def _replace(config: dict[str, Any], path: ConfigPath, make: Any) -> None:
    node: Any = config
    for part in path[:-1]:
        node = node[part]
    node[path[-1]] = make(node[path[-1]])


def seal_config(
    model: type[BaseModel], config: Mapping[str, Any], cipher: TokenCipher
) -> dict[str, Any]:
    """``config`` as stored: every secret value (see :func:`secret_paths`) sealed.

    Values sealed already are kept as they are. Raises
    :class:`~synckit.errors.exceptions.ConfigurationError` when there is a secret to seal and no key
    (unless the cipher is in insecure development mode).
    """
    stored = _copy(config)
    for path in secret_paths(model, stored):
        _replace(stored, path, lambda v: v if is_sealed_value(v) else cipher.seal_value(v))
    return stored


def _open(value: Any, path: ConfigPath, found: list[ConfigPath], open_one: Any, depth: int) -> Any:
    if is_sealed_value(value):
        found.append(path)
        try:
            return open_one(value)
        except SecretUnavailable as exc:
            raise SecretUnavailable(
                f"config field {dotted(path)!r} cannot be opened: {exc}", key_id=exc.key_id
            ) from None
        except SecretCorrupt as exc:
            raise SecretCorrupt(f"config field {dotted(path)}: {exc}") from None
        except ConfigurationError as exc:
            raise ConfigurationError(
                f"config field {dotted(path)!r} cannot be opened: {exc}"
            ) from None
    if depth > _MAX_DEPTH:
        return value
    if isinstance(value, Mapping):
        return {k: _open(v, (*path, k), found, open_one, depth + 1) for k, v in value.items()}
    if isinstance(value, list):
        return [_open(v, (*path, i), found, open_one, depth + 1) for i, v in enumerate(value)]
    return value


def open_config(
    stored: object, cipher: TokenCipher | None, *, reveal: bool = True
) -> tuple[dict[str, Any], list[ConfigPath]]:
    """A stored config with its sealed values opened (``reveal``) or masked (``***``,
    no key needed), and the paths of those values.

    Raises :class:`~synckit.errors.exceptions.ConfigurationError` for a config that is not a JSON
    object or a sealed value that cannot be opened
    (:class:`~synckit.errors.exceptions.SecretUnavailable` when the key is missing),
    naming the field.
    """
    if stored is None:
        return {}, []
    if not isinstance(stored, Mapping):
        raise SecretCorrupt(f"the stored config is a JSON {type(stored).__name__}, not an object")
    if reveal and cipher is None:
        cipher = TokenCipher.from_env()
    found: list[ConfigPath] = []
    open_one = cipher.open_value if reveal and cipher is not None else (lambda _v: MASK)
    opened: dict[str, Any] = _open(stored, (), found, open_one, 0)
    return opened, found


def mask_config(config: Mapping[str, Any], paths: list[ConfigPath]) -> dict[str, Any]:
    """``config`` with ``***`` at each of ``paths`` (paths that are not there are ignored)."""
    masked = _copy(config)
    for path in paths:
        node: Any = masked
        try:
            for part in path[:-1]:
                node = node[part]
            if node[path[-1]] is not None:
                node[path[-1]] = MASK
        except (KeyError, IndexError, TypeError):
            continue
    return masked


def _at(config: Any, path: ConfigPath) -> Any:
    node = config
    for part in path:
        node = node[part]
    return node


def reseal_config(
    stored: Mapping[str, Any], cipher: TokenCipher, model: type[BaseModel] | None = None
) -> dict[str, Any] | None:
    """``stored`` with every secret sealed under ``cipher``'s sealing key, or ``None`` when
    it is so already (what ``synckit secrets rotate`` writes).

    Sealed values under an older key (or kept in plaintext for development) are sealed
    again; with ``model``, plaintext secrets of rows written before configs were sealed
    are sealed too. Values sealed under the sealing key are kept as they are.
    """
    opened, sealed_paths = open_config(stored, cipher)
    paths = dict.fromkeys(sealed_paths)
    if model is not None:
        paths.update(dict.fromkeys(secret_paths(model, opened)))
    out = _copy(stored)
    changed = False
    for path in paths:
        current = _at(stored, path)
        if is_sealed_value(current) and cipher.is_current_value(current):
            continue
        _replace(out, path, lambda _v, p=path: cipher.seal_value(_at(opened, p)))
        changed = True
    return out if changed else None
