"""The rule schema: what a kb/ file may say, validated strictly at load.

Checks are a union discriminated by their leading key (fact, log, signature, microtest,
hang, any); fact paths, regexes, version specifiers and templates are all compiled here, so
a rule that loads is a rule that can run.
"""

from __future__ import annotations

import re
import typing
from functools import cached_property
from typing import Annotated, Any, ClassVar, Literal

import jinja2
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    field_validator,
    model_validator,
)

from diagnose.paths import UnknownPath, check_path, value_type
from diagnose.templates import TEMPLATES
from probes.prefilter import required_literals

Severity = Literal["error", "warning", "info"]
SEVERITY_ORDER = {"error": 0, "warning": 1, "info": 2}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


def _compile(pattern: str, *, multiline: bool = False) -> Any:
    """RE2, or a bounded fallback where look-around is needed (``probes.patterns``): rule
    patterns run over untrusted logs, so one that cannot be bounded is a load error."""
    from probes.patterns import PatternError, compile

    try:
        return compile(pattern, multiline=multiline)
    except PatternError as exc:
        raise ValueError(str(exc)) from None


RegexStr = Annotated[str, AfterValidator(lambda value: _compile(value) and value)]


class _Check(_Strict):
    weight: float = 1.0
    label: str | None = None  # what it means, shown beside the evidence

    # Each kind of check also defines, computed once since rules are immutable:
    #   display: (kind, what, expected) as the report shows it
    #   need: what a user would supply when the check cannot be evaluated


FACT_OPS = (
    "eq", "ne", "lt", "le", "gt", "ge", "in", "not_in",
    "matches", "not_matches", "contains", "exists", "version",
)  # fmt: skip


class FactCheck(_Check):
    fact: str
    eq: Any = None
    ne: Any = None
    lt: float | None = None
    le: float | None = None
    gt: float | None = None
    ge: float | None = None
    in_: list[Any] | None = Field(None, alias="in")
    not_in: list[Any] | None = None
    matches: RegexStr | None = None
    not_matches: RegexStr | None = None
    contains: Any = None
    exists: bool | None = None
    version: str | None = None

    @field_validator("fact")
    @classmethod
    def _path(cls, value: str) -> str:
        try:
            check_path(value)
        except UnknownPath as exc:
            raise ValueError(str(exc)) from None
        return value

    @field_validator("version")
    @classmethod
    def _specifier(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                SpecifierSet(value)
            except InvalidSpecifier:
                raise ValueError(f"bad version specifier {value!r}") from None
        return value

    @model_validator(mode="after")
    def _one_operator(self) -> FactCheck:
        given = [op for op in FACT_OPS if (op if op != "in" else "in_") in self.model_fields_set]
        if len(given) != 1:
            raise ValueError(
                f"a fact check takes exactly one operator of {', '.join(FACT_OPS)} (got {', '.join(given) or 'none'})"
            )
        return self

    @model_validator(mode="after")
    def _operand_fits(self) -> FactCheck:
        """An operand the fact's type can never hold is a rule that can never fire (or one that
        raises when it runs): a load error."""
        known = value_type(self.fact)
        if known is None:
            return self
        tp, is_list = known
        kind = _value_kind(tp)
        op, operand = self.op, self.operand
        if op in ("eq", "ne", "in", "not_in") or (op == "contains" and is_list):
            for value in operand if op in ("in", "not_in") else [operand]:
                problem = _mismatch(kind, tp, value)
                if problem:
                    raise ValueError(f"{op}: {problem} ({self.fact} holds {_kind_name(kind, tp)})")
        elif op in ("lt", "le", "gt", "ge") and kind not in ("number", "string"):
            raise ValueError(f"{op}: a number operand against {self.fact}, which holds {_kind_name(kind, tp)}")
        elif op == "contains" and not (kind == "string" and isinstance(operand, str)):
            raise ValueError(
                f"contains: {self.fact} holds {_kind_name(kind, tp)}; contains takes a string found in a string fact or an element of a list fact"
            )
        elif op == "version" and kind != "string":
            raise ValueError(f"version: {self.fact} holds {_kind_name(kind, tp)}, not a version")
        return self

    @cached_property
    def op(self) -> str:
        return next(op for op in FACT_OPS if (op if op != "in" else "in_") in self.model_fields_set)

    @cached_property
    def operand(self) -> Any:
        return getattr(self, "in_" if self.op == "in" else self.op)

    @cached_property
    def regex(self) -> re.Pattern[str] | None:
        pattern = self.matches if self.matches is not None else self.not_matches
        return None if pattern is None else _compile(pattern)

    @cached_property
    def key(self) -> tuple[str, str, str]:
        """What the check's result depends on besides the facts: checks alike share one result."""
        return self.fact, self.op, repr(self.operand)

    @cached_property
    def specifier(self) -> SpecifierSet | None:
        return None if self.version is None else SpecifierSet(self.version)

    @cached_property
    def display(self) -> tuple[str, str, str]:
        operand = self.operand
        symbol = {"eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}.get(self.op)
        if symbol:
            shown = (
                f"{operand:g}" if isinstance(operand, float) else repr(operand) if isinstance(operand, str) else operand
            )
            return "fact", self.fact, f"{symbol} {shown}"
        if self.op == "exists":
            return "fact", self.fact, "present" if operand else "absent"
        if self.op == "version":
            return "fact", self.fact, f"version {operand}"
        return "fact", self.fact, f"{self.op.replace('_', ' ')} {operand!r}"

    @cached_property
    def need(self) -> str:
        return self.fact


def _value_kind(tp: Any) -> str:
    """What a fact's values are, as far as an operand goes: number, bool, string, choice or other."""
    if typing.get_origin(tp) is Literal:
        return "choice"
    if tp is bool:
        return "bool"
    if tp in (int, float):
        return "number"
    if tp is str:
        return "string"
    return "other"


def _kind_name(kind: str, tp: Any) -> str:
    if kind == "choice":
        return "one of " + ", ".join(map(str, typing.get_args(tp)))
    return {"number": "a number", "bool": "true or false", "string": "text"}.get(
        kind, f"a {getattr(tp, '__name__', tp)}"
    )


def _mismatch(kind: str, tp: Any, value: Any) -> str | None:
    """Why a fact of this kind can never equal ``value``, or None."""
    if value is None:
        return None
    if kind == "choice" and value not in typing.get_args(tp):
        return f"{value!r} is not a value it can take"
    if kind in ("string", "choice") and not isinstance(value, str):
        return f"a {type(value).__name__} operand against text"
    if kind in ("number", "bool") and isinstance(value, str):
        return "a text operand against a number"
    return None


class LogCheck(_Check):
    log: RegexStr

    @cached_property
    def regex(self) -> re.Pattern[str]:
        return _compile(self.log)

    @cached_property
    def literals(self) -> tuple[str, ...] | None:
        return required_literals(self.log)

    @cached_property
    def prefilter(self) -> Any:
        """The same pattern over the joined log text: finds every line the per-line search would."""
        return _compile(self.log, multiline=True)

    @cached_property
    def whole_text(self) -> Any | None:
        """``prefilter`` where one search of the joined log is cheaper than testing lines: always
        on RE2 (linear); on the line-by-line fallback only when no literal selects the lines."""
        return self.prefilter if self.on_re2 or self.literals is None else None

    @cached_property
    def on_re2(self) -> bool:
        from probes.patterns import engine

        return engine(self.log) == "re2"

    display = cached_property(lambda self: ("log", self.log, "a log line matches"))
    need: ClassVar[str] = "log"


class SignatureCheck(_Check):
    signature: str
    display = cached_property(lambda self: ("signature", self.signature, "seen in the log"))
    need: ClassVar[str] = "log"

    @field_validator("signature")
    @classmethod
    def _known(cls, value: str) -> str:
        from probes.log import known_signatures

        known = known_signatures()
        if value not in known:
            import difflib

            hint = difflib.get_close_matches(value, list(known), n=1)
            suggestion = f" (did you mean '{hint[0]}'?)" if hint else ""
            raise ValueError(f"unknown log signature '{value}'{suggestion}")
        return value


TestStatus = Literal["passed", "failed", "timed_out", "skipped", "error"]


class MicrotestCheck(_Check):
    microtest: str
    status: list[TestStatus]
    variant: str | None = None

    @field_validator("status", mode="before")
    @classmethod
    def _listify(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value

    @field_validator("microtest")
    @classmethod
    def _known(cls, value: str) -> str:
        from probes.facts import MicroTests

        names = [n for n in MicroTests.model_fields if n not in ("source", "unavailable")]
        if value not in names:
            raise ValueError(f"unknown micro-test '{value}' (one of {', '.join(names)})")
        return value

    @cached_property
    def display(self) -> tuple[str, str, str]:
        what = self.microtest + (f" [{self.variant}]" if self.variant else "")
        return "microtest", what, " or ".join(self.status)

    need = cached_property(lambda self: f"microtests.{self.microtest}")


class HangCheck(_Check):
    hang: RegexStr
    ranks: Literal["any", "all", "some"] = "any"

    @cached_property
    def regex(self) -> re.Pattern[str]:
        return _compile(self.hang)

    display = cached_property(lambda self: ("hang", self.hang, f"{self.ranks} hung ranks wait there"))
    need: ClassVar[str] = "hang"


class AnyCheck(_Check):
    any: list[Check]
    display = cached_property(lambda self: ("any", " | ".join(c.display[1] for c in self.any), "any of these holds"))
    need = cached_property(lambda self: " or ".join(dict.fromkeys(c.need for c in self.any)))


class AllCheck(_Check):
    """A conjunction that weighs once: evidence that means something only with another (a
    message every single-node run prints, on a report about several nodes)."""

    all: list[Check] = Field(min_length=2)
    display = cached_property(lambda self: ("all", " & ".join(c.display[1] for c in self.all), "all of these hold"))
    need = cached_property(lambda self: " and ".join(dict.fromkeys(c.need for c in self.all)))

    @field_validator("all")
    @classmethod
    def _flat(cls, checks: list[Check]) -> list[Check]:
        if any(isinstance(c, (AnyCheck, AllCheck)) for c in checks):
            raise ValueError("an 'all' group holds plain checks, not other groups")
        return checks


def parts(check: Any) -> list[Any]:
    """The checks inside a group ('any', 'all'); none for a plain check."""
    if isinstance(check, AnyCheck):
        return check.any
    if isinstance(check, AllCheck):
        return check.all
    return []


CHECK_KINDS = ("fact", "log", "signature", "microtest", "hang", "any", "all")


def _kind(value: Any) -> str | None:
    if isinstance(value, dict):
        keys = [k for k in CHECK_KINDS if k in value]
    else:
        keys = [k for k in CHECK_KINDS if hasattr(value, k)]
    return keys[0] if len(keys) == 1 else None


Check = Annotated[
    Annotated[FactCheck, Tag("fact")]
    | Annotated[LogCheck, Tag("log")]
    | Annotated[SignatureCheck, Tag("signature")]
    | Annotated[MicrotestCheck, Tag("microtest")]
    | Annotated[HangCheck, Tag("hang")]
    | Annotated[AnyCheck, Tag("any")]
    | Annotated[AllCheck, Tag("all")],
    Discriminator(
        _kind,
        custom_error_type="check_kind",
        custom_error_message=f"a check needs exactly one of the keys {', '.join(CHECK_KINDS)}",
    ),
]
AnyCheck.model_rebuild()
AllCheck.model_rebuild()


class Fix(_Strict):
    title: str
    kind: Literal["code", "env", "shell", "config"] = "code"
    language: str = "python"
    snippet: str

    @field_validator("title")
    @classmethod
    def _plain_title(cls, value: str) -> str:
        if "{{" in value or "{%" in value:
            raise ValueError("a fix title is plain text; put template expressions in the snippet")
        return value

    @field_validator("snippet")
    @classmethod
    def _template(cls, value: str) -> str:
        try:
            TEMPLATES.parse(value)
        except jinja2.TemplateSyntaxError as exc:
            raise ValueError(f"template syntax error on snippet line {exc.lineno}: {exc.message}") from None
        return value

    @cached_property
    def template(self) -> jinja2.Template:
        return TEMPLATES.from_string(self.snippet)


class Example(_Strict):
    name: str | None = None
    expect: Literal["match", "no-match", "known-miss"]
    facts: dict[str, Any] = Field(default_factory=dict)
    log: str | None = None
    report: str | None = None  # a pasted environment report, read by probes.report
    note: str | None = None


class Rule(_Strict):
    id: str = Field(pattern=r"^[a-z0-9][a-z0-9-]*(\.[a-z0-9][a-z0-9-]*)+$")
    title: str
    severity: Severity
    status: Literal["stable", "preview", "deprecated"] = "stable"
    since: str = "0.1.0"
    aliases: list[str] = Field(default_factory=list)
    tags: list[str] = Field(default_factory=list)
    # the symptoms (kb/symptoms.yaml) this cause produces, and how common it is among their
    # causes (from the real cases): each observed symptom makes the rule a candidate. Every
    # shipped rule names some (a test checks); a site's own policy rule may name none.
    explains: list[str] = Field(default_factory=list)
    prior: float = Field(0.2, ge=0, le=1)
    # the one thing a user can do to confirm or rule out this cause when evidence is thin
    check: str | None = None
    when: list[Check] = Field(default_factory=list)
    evidence: list[Check] = Field(min_length=1)
    min_score: float = 1.0
    explain: str
    fix: list[Fix] = Field(min_length=1)
    references: list[str] = Field(min_length=1)
    examples: list[Example]

    @field_validator("explains")
    @classmethod
    def _known_symptoms(cls, symptoms: list[str]) -> list[str]:
        from probes.signatures import shipped

        known = shipped().symptoms
        unknown = [s for s in symptoms if s not in known]
        if unknown:
            raise ValueError(f"unknown symptom(s) {unknown} (kb/symptoms.yaml lists {', '.join(known)})")
        return symptoms

    @field_validator("when")
    @classmethod
    def _unweighted(cls, checks: list[Check]) -> list[Check]:
        for check in checks:
            if "weight" in check.model_fields_set:
                raise ValueError("a 'when' check is a gate and takes no weight")
        return checks

    @field_validator("evidence")
    @classmethod
    def _no_any(cls, checks: list[Check]) -> list[Check]:
        if any(isinstance(c, AnyCheck) for c in checks):
            raise ValueError("'any' groups belong in 'when'; give each evidence its own weight")
        return checks

    @field_validator("references")
    @classmethod
    def _urls(cls, refs: list[str]) -> list[str]:
        for ref in refs:
            if not re.match(r"^https?://\S+$", ref):
                raise ValueError(f"reference {ref!r} is not a URL: cite the public thread or page")
        return refs

    @field_validator("examples")
    @classmethod
    def _both_examples(cls, examples: list[Example]) -> list[Example]:
        missing = {"match", "no-match"} - {e.expect for e in examples}
        if missing:
            raise ValueError(
                f"examples need at least one match and one no-match (missing {', '.join(sorted(missing))})"
            )
        return examples
