"""The signature catalog: what a log line can say, as data (``kb/signatures/*.yaml``).

A signature names an observation, never a cause: the wordings of one error or state across
library versions and the words users write, the fields its patterns extract (named groups;
a group named ``rank`` attributes the line to that rank) and the symptoms it shows. The
symptoms come from the closed vocabulary of ``kb/symptoms.yaml``. Rules refer to signatures by
id (``{signature: ID}``) and to symptoms in ``explains``.

The reader looks only at lines that hold a literal every match of some pattern must contain
(``probes.prefilter.required_literals``); a pattern without such a literal needs ``anchors``
(lowercase strings, one of which each matching line holds), so no signature is ever skipped
silently. ``unless`` patterns veto a match on their line (a library's warning that a hang may
follow is no hang told). Every signature proves itself with ``examples`` (``match`` lines it
must recognise, ``no_match`` lines it must not), run by ``diagnose kb test`` and the test suite.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from probes import patterns
from probes.prefilter import required_literals


class CatalogError(ValueError):
    """A signature or symptom file that does not load; ``problems`` holds one line each."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        super().__init__(problems[0] + more)


# The shipped kb/ is this package's own data, read on every run: libyaml's parser (about twenty
# times faster) when PyYAML has it. Files a user supplies go through the pure-Python parser,
# whose nesting depth ends in a RecursionError, not in the C stack.
SHIPPED_YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def kb_dir() -> Path:
    """The shipped kb/: inside an installed wheel (as diagnose/kb), else the checkout's kb/."""
    root = Path(__file__).resolve().parent.parent
    installed = root / "diagnose" / "kb"
    return installed if installed.is_dir() else root / "kb"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Symptom(_Strict):
    id: str
    title: str
    check: str  # the one thing to do when the evidence cannot tell the causes apart
    # named only when no other symptom is: a vaguer statement than any other (an error of no known kind)
    fallback: bool = False


class Examples(_Strict):
    match: list[str] = Field(min_length=1)
    no_match: list[str] = Field(default_factory=list)


def _compile(pattern: str) -> Any:
    """RE2, or the bounded fallback where look-around is needed (``probes.patterns``):
    signatures run over untrusted logs, so a pattern that cannot be bounded is a load error,
    reported by ``load_catalog`` with its file and place."""
    try:
        return patterns.compile(pattern)
    except patterns.PatternError as exc:
        raise ValueError(str(exc)) from None


def _groups(m: Any) -> dict[str, str]:
    return {k: v.strip() for k, v in m.groupdict().items() if v is not None}


class SignatureDef(_Strict):
    id: str = Field(pattern=r"^[a-z][a-z0-9_]*$")
    description: str
    symptoms: list[str] = Field(default_factory=list)
    patterns: list[str] = Field(min_length=1)
    fields: list[str] = Field(default_factory=list)  # searched on a matching line for more groups
    # a line these match is not this signature's, though a pattern matches it: a library's
    # warning that a hang *may* follow is no hang told
    unless: list[str] = Field(default_factory=list)
    anchors: list[str] = Field(default_factory=list)
    examples: Examples

    @field_validator("patterns", "fields", "unless")
    @classmethod
    def _regexes(cls, values: list[str]) -> list[str]:
        for value in values:
            _compile(value)
        return values

    @field_validator("anchors")
    @classmethod
    def _lowercase(cls, values: list[str]) -> list[str]:
        bad = [a for a in values if a != a.lower() or len(a) < 3]
        if bad:
            raise ValueError(f"anchors are lowercase strings of 3 or more characters (got {bad})")
        return values

    @model_validator(mode="after")
    def _findable(self) -> SignatureDef:
        if not self.anchors:
            blind = [p for p in self.patterns if required_literals(p) is None]
            if blind:
                raise ValueError(f"pattern {blind[0]!r} has no literal the reader can look for: give 'anchors'")
        return self

    @functools.cached_property
    def compiled(self) -> tuple[Any, ...]:
        return tuple(_compile(p) for p in self.patterns)

    @functools.cached_property
    def compiled_fields(self) -> tuple[Any, ...]:
        return tuple(_compile(f) for f in self.fields)

    @functools.cached_property
    def compiled_unless(self) -> tuple[Any, ...]:
        return tuple(_compile(u) for u in self.unless)

    @functools.cached_property
    def literals(self) -> tuple[str, ...]:
        """Lowercase strings one of which every line this signature matches contains."""
        if self.anchors:
            return tuple(self.anchors)
        found: set[str] = set()
        for pattern in self.patterns:
            found.update(required_literals(pattern) or ())
        return tuple(sorted(found))

    def every(self, line: str) -> list[dict[str, str]]:
        """The named groups of each place in a line that a pattern matches: a line may state
        several ("box1 has pytorch:23.10-py3, box2 has pytorch:24.03-py3")."""
        if any(u.search(line) for u in self.compiled_unless):
            return []
        return [_groups(m) for pattern in self.compiled for m in pattern.finditer(line)]

    def match(self, line: str) -> dict[str, str] | None:
        for pattern in self.compiled:
            m = pattern.search(line)
            if m:
                if any(u.search(line) for u in self.compiled_unless):
                    return None
                data = _groups(m)
                for extra in self.compiled_fields:
                    f = extra.search(line)
                    if f:
                        data.update({k: v.strip() for k, v in f.groupdict().items() if v})
                return data
        return None


class Catalog:
    """Symptoms and signatures, validated together (a signature's symptoms must exist)."""

    def __init__(self, symptoms: dict[str, Symptom], signatures: dict[str, SignatureDef]):
        self.symptoms = symptoms
        self.signatures = signatures

    @functools.cached_property
    def order(self) -> dict[str, int]:
        return {sid: i for i, sid in enumerate(self.signatures)}

    @functools.cached_property
    def by_literal(self) -> dict[str, tuple[SignatureDef, ...]]:
        """Each lowercase literal -> the signatures a line holding it may match."""
        index: dict[str, list[SignatureDef]] = {}
        for sig in self.signatures.values():
            for literal in sig.literals:
                index.setdefault(literal, []).append(sig)
        return {k: tuple(v) for k, v in index.items()}


def _problem(path: Path, place: str, message: str) -> str:
    return f"{path}: {place}: {message}" if place else f"{path}: {message}"


def _read(path: Path, key: str) -> Any:
    try:
        data = yaml.load(path.read_text(encoding="utf-8"), Loader=SHIPPED_YAML_LOADER)
    except (OSError, UnicodeDecodeError) as exc:
        raise CatalogError([_problem(path, "", f"cannot read: {exc}")]) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark else str(path)
        raise CatalogError([f"{where}: invalid YAML: {getattr(exc, 'problem', exc)}"]) from None
    if not isinstance(data, dict) or set(data) != {key}:
        raise CatalogError([_problem(path, "", f"expected a mapping with the single key '{key}'")])
    return data[key]


def _validation_problem(path: Path, prefix: str, exc: ValidationError) -> str:
    first = exc.errors()[0]
    place = ".".join([prefix, *(str(p) for p in first["loc"])]).strip(".")
    return _problem(path, place, first["msg"].removeprefix("Value error, "))


def load_catalog(root: Path | None = None) -> Catalog:
    """Read ``symptoms.yaml`` and ``signatures/*.yaml`` under ``root`` (the shipped kb/)."""
    root = root or kb_dir()
    problems: list[str] = []
    symptoms: dict[str, Symptom] = {}
    path = root / "symptoms.yaml"
    entries = _read(path, "symptoms")
    if not isinstance(entries, dict):
        raise CatalogError([_problem(path, "symptoms", "a mapping of symptom id to its title and check")])
    for sid, body in entries.items():
        try:
            symptoms[sid] = Symptom.model_validate({"id": sid, **(body if isinstance(body, dict) else {})})
        except ValidationError as exc:
            problems.append(_validation_problem(path, f"symptoms.{sid}", exc))
    signatures: dict[str, SignatureDef] = {}
    for path in sorted((root / "signatures").glob("*.yaml")):
        entries = _read(path, "signatures")
        if not isinstance(entries, list):
            problems.append(_problem(path, "signatures", "a list of signatures"))
            continue
        for i, body in enumerate(entries):
            place = f"signatures[{i}]"
            try:
                sig = SignatureDef.model_validate(body)
            except ValidationError as exc:
                problems.append(_validation_problem(path, place, exc))
                continue
            if sig.id in signatures:
                problems.append(_problem(path, f"{place}.id", f"duplicate signature id '{sig.id}'"))
            unknown = [s for s in sig.symptoms if s not in symptoms]
            if unknown:
                problems.append(_problem(path, f"{place}.symptoms", f"unknown symptom(s) {unknown}"))
            signatures[sig.id] = sig
    if problems:
        raise CatalogError(problems)
    return Catalog(symptoms, signatures)


@functools.cache
def shipped() -> Catalog:
    return load_catalog()
