"""Fact paths: checked against the Facts model when a rule loads, looked up when it runs."""

from __future__ import annotations

import difflib
import functools
import types
import typing
from typing import Any

from pydantic import BaseModel

from probes.facts import MEASUREMENTS, Facts, KeyedSection, MicroTest


class UnknownPath(ValueError):
    pass


def _unwrap(annotation: Any) -> tuple[Any, bool]:
    """The model or scalar type behind Optional[...] / list[...]; and whether a list was crossed."""
    is_list = False
    while True:
        origin = typing.get_origin(annotation)
        if origin in (typing.Union, types.UnionType):
            args = [a for a in typing.get_args(annotation) if a is not type(None)]
            annotation = args[0] if len(args) == 1 else annotation
            if len(args) != 1:
                return annotation, is_list
        elif origin is list:
            is_list = True
            annotation = typing.get_args(annotation)[0]
        else:
            return annotation, is_list


def _is_model(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, BaseModel)


@functools.cache
def known_paths() -> tuple[str, ...]:
    """Every path a rule can name (keyed sections as ``NAME.<NAME>``), for suggestions and docs."""
    out: list[str] = []

    def walk(model: type[BaseModel], prefix: str) -> None:
        for name, field in model.model_fields.items():
            if name in ("source", "unavailable"):
                continue
            path = f"{prefix}{name}"
            tp, _ = _unwrap(field.annotation)
            if _is_model(tp) and issubclass(tp, KeyedSection):
                out.append(f"{path}.<NAME>")  # any key: packages.torch, env.RANK
                out.extend(f"{path}.{derived}" for derived in getattr(tp, "derived", ()))
                continue
            out.append(path)
            if _is_model(tp):
                walk(tp, path + ".")
        for name in getattr(model, "derived", ()):
            out.append(f"{prefix}{name}")

    walk(Facts, "")
    return tuple(out)


@functools.cache
def check_path(path: str) -> None:
    """Raise UnknownPath (with a suggestion) unless ``path`` names a fact."""
    model: type[BaseModel] = Facts
    parts = path.split(".")
    for i, part in enumerate(parts):
        rest = parts[i + 1 :]
        if issubclass(model, KeyedSection) and i > 0:
            if rest:
                break
            return
        if part in getattr(model, "derived", ()):
            if rest:
                break
            return
        field = model.model_fields.get(part)
        if field is None or part in ("values", "complete"):
            break
        tp, _ = _unwrap(field.annotation)
        if typing.get_origin(tp) is dict:
            if part == "measurements" and model is MicroTest and rest:
                test = parts[i - 1]
                if rest[0] not in MEASUREMENTS.get(test, ()):
                    hint = difflib.get_close_matches(rest[0], sorted(MEASUREMENTS.get(test, ())), n=1)
                    suggestion = f" (did you mean '{hint[0]}'?)" if hint else ""
                    raise UnknownPath(f"the {test} micro-test measures no '{rest[0]}'{suggestion}")
            if len(rest) <= 1:
                return
            break
        if _is_model(tp):
            if not rest:
                if issubclass(tp, KeyedSection):
                    break  # a keyed section needs a key: packages.torch, env.RANK
                return
            model = tp
            continue
        if rest:
            break
        return
    hint = difflib.get_close_matches(path, known_paths(), n=1)
    suggestion = f" (did you mean '{hint[0]}'?)" if hint else ""
    raise UnknownPath(f"unknown fact path '{path}'{suggestion}")


_MISSING = object()


def lookup(facts: Facts, path: str) -> tuple[bool, Any]:
    """(known, value) for a checked path. Unknown when any step is None or not collected."""
    node: Any = facts
    parts = _parts(path)
    for i, part in enumerate(parts):
        if isinstance(node, BaseModel):  # the common step first: a section, a field
            if isinstance(node, KeyedSection):
                return node.lookup(part)
            node = getattr(node, part)
            if node is None:
                return False, None
            continue
        if isinstance(node, list):
            values = []
            for item in node:
                known, value = lookup_in(item, parts[i:])
                if known and value is not None:
                    values.extend(value if isinstance(value, list) else [value])
            return True, values
        if isinstance(node, dict):
            value = node.get(part, _MISSING)
            if value is _MISSING:
                return False, None
            node = value
            continue
        node = getattr(node, part)
        if node is None:
            return False, None
    return True, node


@functools.lru_cache(maxsize=4096)
def _parts(path: str) -> tuple[str, ...]:
    return tuple(path.split("."))


def lookup_in(node: Any, parts: tuple[str, ...] | list[str]) -> tuple[bool, Any]:
    for part in parts:
        node = node.get(part) if isinstance(node, dict) else getattr(node, part, None)
        if node is None:
            return False, None
    return True, node


@functools.cache
def value_type(path: str) -> tuple[Any, bool] | None:
    """(the type of the value a checked path names, whether it is a list of them), or None
    where the model does not say (a derived fact, a value under a dict of mixed types).
    A keyed section's values are strings (``env.RANK``, ``packages.torch``)."""
    model: type[BaseModel] = Facts
    is_list = False
    for part in path.split("."):
        if part in getattr(model, "derived", ()):
            return None
        if issubclass(model, KeyedSection):
            return str, is_list
        field = model.model_fields[part]
        tp, crossed = _unwrap(field.annotation)
        is_list = is_list or crossed
        if typing.get_origin(tp) is dict:
            value, _ = _unwrap(typing.get_args(tp)[1])
            return None if typing.get_origin(value) in (typing.Union, types.UnionType) else (value, is_list)
        if _is_model(tp):
            model = tp
            continue
        return tp, is_list
    return None
