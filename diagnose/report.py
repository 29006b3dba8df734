"""The Report: what every view (JSON, text, markdown, TUI) renders. Versioned, with a schema."""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from probes.facts import Facts, ProbeError, Skipped

# Bump the minor for additive changes, the major when a consumer would misread old data.
REPORT_SCHEMA_VERSION = "1.4"

Confidence = Literal["high", "medium", "low"]
CheckState = Literal["fired", "not_fired", "unknown"]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class _Shared(_Model):
    """An entry the engine may hand to several reports (the same rule, the same reason):
    immutable, so changing one report can never change another."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class EvidenceItem(_Shared):
    kind: Literal["fact", "log", "signature", "microtest", "hang", "any", "all"]
    what: str  # the fact path, pattern, signature id, micro-test or hang pattern
    expected: str
    observed: Any = None
    state: CheckState
    weight: float
    label: str | None = None
    lines: tuple[str, ...] = Field(default_factory=tuple)  # log excerpts that fired


class RenderedFix(_Model):
    title: str
    kind: str
    language: str
    snippet: str


class SymptomSeen(_Model):
    """A symptom the facts show (kb/symptoms.yaml) and what showed it."""

    id: str
    title: str
    check: str  # what narrows the causes down when the evidence is thin
    shown_by: list[str]  # "log SIGNATURE", "stack in PLACE", "micro-test NAME timed out"


class Finding(_Model):
    id: str
    title: str
    severity: Literal["error", "warning", "info"]
    score: float
    confidence: Confidence
    # "evidence": its own evidence reached the rule's threshold; "symptom": a candidate for an
    # observed symptom that it commonly causes, without decisive evidence yet
    basis: Literal["evidence", "symptom"] = "evidence"
    explains: list[str] = Field(default_factory=list)  # the observed symptoms it would explain
    check: str | None = None  # what confirms or rules it out
    explain: str
    evidence: list[EvidenceItem]
    gate: list[EvidenceItem] = Field(default_factory=list)
    missing: list[str] = Field(default_factory=list)  # facts that were unknown
    fixes: list[RenderedFix]
    references: list[str]


class RuleOutcome(_Shared):
    """A rule that is not a finding: why it was ruled out, or what it could not check."""

    id: str
    title: str
    severity: Literal["error", "warning", "info"]
    reason: str
    missing: tuple[str, ...] = Field(default_factory=tuple)


class Summary(_Model):
    errors: int
    warnings: int
    infos: int
    top: str | None  # id of the first-ranked finding
    rules: int


class Report(_Model):
    schema_version: str = REPORT_SCHEMA_VERSION
    tool: dict[str, str]
    summary: Summary
    symptoms: list[SymptomSeen] = Field(default_factory=list)  # what happened, before causes
    findings: list[Finding]  # ranked: highest score first
    possible: list[RuleOutcome]  # gate holds, nothing decisive seen, some evidence unknown
    not_checked: list[RuleOutcome]  # the gate itself could not be checked
    ruled_out: list[RuleOutcome]
    probe_errors: list[ProbeError]
    skipped: list[Skipped]
    facts: Facts

    @property
    def has_error(self) -> bool:
        return any(f.severity == "error" for f in self.findings)


def report_json_schema() -> str:
    schema = Report.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["$id"] = f"https://lightning-diagnose/report-{REPORT_SCHEMA_VERSION}.json"
    return json.dumps(schema, indent=2, sort_keys=True) + "\n"
