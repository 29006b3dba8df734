"""The sandbox that fills a rule's fix snippets in from the facts.

Rule files come from users (``--kb DIR``) as well as from us, and a snippet is a Jinja2
template, so rendering one must not be able to change the report, run for long or take
much memory. On top of Jinja2's immutable sandbox (no ``env.update()``, no
``facts.log.lines.clear()``):

- models expose their fields and plain properties only, none of their methods;
- every render has a step budget (template lines executed, loop turns included), an
  output cap, and ``range``, string repetition, powers and padding widths are capped;
- any failure, from ``{{ 1/0 }}`` to a recursive macro, is contained by ``render_fix``: the
  snippet is shown as written with a note saying why it could not be filled in.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

import jinja2
from jinja2.exceptions import SecurityError
from jinja2.sandbox import ImmutableSandboxedEnvironment
from pydantic import BaseModel

MAX_OUTPUT = 16_000  # characters of one rendered snippet
MAX_TEXT = 16_000  # a string or list built inside a template (repetition, padding)
MAX_RANGE = 1_000
MAX_STEPS = 50_000  # template lines executed in one render
MAX_POWER_BITS = 4_096
_TEMPLATE_FILE = "<template>"
_WIDTH = re.compile(r"\d{5,}")  # a width or precision of 10,000 or more in a format spec
_PADDING = frozenset({"center", "ljust", "rjust", "zfill", "expandtabs", "format", "format_map"})


class TemplateBudgetError(SecurityError):
    """A template went over one of the caps above."""


def _capped_range(*args: int) -> range:
    result = range(*args)
    if len(result) > MAX_RANGE:
        raise TemplateBudgetError(f"range of {len(result)} items (at most {MAX_RANGE})")
    return result


def _size(value: Any) -> int:
    return len(value) if isinstance(value, (str, bytes, list, tuple)) else 0


class FixTemplates(ImmutableSandboxedEnvironment):
    intercepted_binops = frozenset({"*", "**", "%"})

    def __init__(self) -> None:
        super().__init__(undefined=jinja2.StrictUndefined, autoescape=False, keep_trailing_newline=True)
        self.globals = {"range": _capped_range, "dict": dict}
        for name in ("center", "indent", "wordwrap", "format"):
            self.filters[name] = _checked_filter(self.filters[name])

    def is_safe_attribute(self, obj: Any, attr: str, value: Any) -> bool:
        if not super().is_safe_attribute(obj, attr, value):
            return False
        if isinstance(obj, BaseModel):
            # fields and computed properties: what a rule's fact paths can name, nothing else
            return attr in type(obj).model_fields or isinstance(getattr(type(obj), attr, None), property)
        return True

    def call_binop(self, context: jinja2.runtime.Context, operator: str, left: Any, right: Any) -> Any:
        if operator == "*":
            count = right if isinstance(right, int) else left if isinstance(left, int) else 0
            size = _size(left) or _size(right)
            if size and count * size > MAX_TEXT:
                raise TemplateBudgetError(f"repetition to {count * size} items (at most {MAX_TEXT})")
        elif operator == "**":
            if isinstance(left, int) and isinstance(right, int) and right > 0 and abs(left) > 1:
                if right * abs(left).bit_length() > MAX_POWER_BITS:
                    raise TemplateBudgetError(f"power too large ({left} ** {right})")
        elif operator == "%" and isinstance(left, str) and _WIDTH.search(left):
            raise TemplateBudgetError("format width or precision too large")
        return super().call_binop(context, operator, left, right)

    def wrap_str_format(self, value: Any) -> Callable[..., str] | None:
        owner = getattr(value, "__self__", None)
        if (
            getattr(value, "__name__", "") in ("format", "format_map")
            and isinstance(owner, str)
            and _WIDTH.search(owner)
        ):
            raise TemplateBudgetError("format width or precision too large")
        return super().wrap_str_format(value)

    def call(__self, __context: jinja2.runtime.Context, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805 - Jinja2's signature
        name = getattr(__obj, "__name__", "")
        if name in _PADDING and isinstance(getattr(__obj, "__self__", None), str):
            _check_widths(args, kwargs)
        return super().call(__context, __obj, *args, **kwargs)


def _check_widths(args: tuple, kwargs: dict) -> None:
    for value in (*args, *kwargs.values()):
        if isinstance(value, int) and value > MAX_TEXT:
            raise TemplateBudgetError(f"width {value} (at most {MAX_TEXT})")
        if isinstance(value, str) and _WIDTH.search(value):
            raise TemplateBudgetError("format width or precision too large")


def _checked_filter(inner: Callable[..., Any]) -> Callable[..., Any]:
    def checked(*args: Any, **kwargs: Any) -> Any:
        _check_widths(args[1:], kwargs)
        return inner(*args, **kwargs)

    for attr in ("jinja_pass_arg",):
        if hasattr(inner, attr):
            setattr(checked, attr, getattr(inner, attr))
    return checked


TEMPLATES = FixTemplates()


class _Steps:
    """Counts lines executed in template code; past the budget the render stops."""

    def __init__(self, budget: int) -> None:
        self.left = budget

    def __call__(self, frame: FrameType, event: str, arg: Any) -> Any:
        if frame.f_code.co_filename != _TEMPLATE_FILE:
            return None
        return self._line

    def _line(self, frame: FrameType, event: str, arg: Any) -> Any:
        if event == "line":
            self.left -= 1
            if self.left < 0:
                raise TemplateBudgetError(f"more than {MAX_STEPS} steps")
        return self._line


def render(template: jinja2.Template, context: dict[str, Any]) -> str:
    """Render within the caps; raises on any failure (``render_fix`` contains it)."""
    previous = sys.gettrace()
    sys.settrace(_Steps(MAX_STEPS))
    try:
        return _collect(template.generate(context))
    finally:
        sys.settrace(previous)


def _collect(chunks: Iterator[str]) -> str:
    out: list[str] = []
    size = 0
    for chunk in chunks:
        size += len(chunk)
        if size > MAX_OUTPUT:
            raise TemplateBudgetError(f"output over {MAX_OUTPUT} characters")
        out.append(chunk)
    return "".join(out)


def render_fix(snippet: str, template: jinja2.Template, context: dict[str, Any]) -> str:
    """The snippet filled in, or as written with a note: a fix never fails a diagnosis."""
    try:
        return render(template, context)
    except RecursionError:
        why = "recursion too deep"
    except MemoryError:
        why = "out of memory"
    except Exception as exc:  # noqa: BLE001 - any template failure is shown, never raised
        why = f"{type(exc).__name__}: {exc}" if not isinstance(exc, jinja2.TemplateError) else str(exc)
    return f"{snippet}\n# (could not fill in from the facts: {why[:200]})"


def lint_fix(snippet: str, contexts: list[dict[str, Any]]) -> str | None:
    """Why a snippet cannot be filled in from one of the contexts (an empty and a full
    snapshot), or None: what ``kb lint`` reports."""
    try:
        template = TEMPLATES.from_string(snippet)
    except jinja2.TemplateSyntaxError as exc:
        return f"template syntax error on snippet line {exc.lineno}: {exc.message}"
    for context in contexts:
        try:
            render(template, context)
        except RecursionError:
            return "recursion too deep"
        except Exception as exc:  # noqa: BLE001 - reported, not raised
            return f"{type(exc).__name__}: {exc}"[:300]
    return None
