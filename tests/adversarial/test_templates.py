"""Fix templates cannot hurt: no mutation, bounded work and output, every failure contained."""

from __future__ import annotations

from pathlib import Path

import pytest

from diagnose.engine import render_context
from diagnose.kb import load_kb
from diagnose.templates import MAX_OUTPUT, TEMPLATES, lint_fix, render_fix
from probes.facts import Facts, LogLine
from probes.snapshot import load_snapshot

FULL = Path(__file__).resolve().parents[1] / "fixtures" / "snapshots" / "devices_duplicate-gpu.json"


def _facts() -> Facts:
    facts = load_snapshot(FULL)
    facts.env.values["NCCL_DEBUG"] = "INFO"
    facts.log.lines = [LogLine(no=1, text="RuntimeError: boom")]
    return facts


def _fill(snippet: str, facts: Facts | None = None) -> str:
    context = render_context(facts or _facts())
    return render_fix(snippet, TEMPLATES.from_string(snippet), context)


@pytest.mark.parametrize(
    ("snippet", "why"),
    [
        ("{{ 1/0 }}", "ZeroDivisionError"),
        ("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}", "recursion"),
        ("{{ range(10**12)|length }}", "range of"),
        (
            "{% for i in range(1000) %}{% for j in range(1000) %}{% for k in range(1000) %}{% endfor %}{% endfor %}{% endfor %}",
            "steps",
        ),
        ("{{ 'x' * 10**9 }}", "repetition"),
        ("{{ ['x'] * 10**9 }}", "repetition"),
        ("{{ 9 ** 9999999 }}", "power"),
        ("{{ '%09999999d' % 1 }}", "width"),
        ("{{ 'a'.center(10**9) }}", "width"),
        ("{{ '{:>999999999}'.format(1) }}", "width"),
        ("{{ 'x'|center(10**9) }}", "width"),
        ("{{ 'x'|indent(10**9, true) }}", "width"),
        ("{% for i in range(1000) %}{{ 'y' * 1000 }}{% endfor %}", "output over"),
        ("{{ missing_name }}", "undefined"),
        ("{{ facts.model_dump() }}", "unsafe"),
        ("{{ facts.__class__ }}", "unsafe"),
    ],
)
def test_hostile_template_is_contained_as_snippet_plus_note(snippet: str, why: str) -> None:
    out = _fill(snippet)
    assert out.startswith(snippet + "\n# (could not fill in from the facts: ")
    assert why.lower() in out.lower()
    assert len(out) < MAX_OUTPUT


@pytest.mark.parametrize(
    "snippet",
    [
        "{{ env.update({'NCCL_DEBUG': 'WARN'}) }}",
        "{{ env.clear() }}",
        "{{ facts.log.lines.clear() }}",
        "{{ facts.log.lines.append(1) }}",
        "{{ packages.pop('torch', None) }}",
    ],
)
def test_templates_cannot_change_the_facts(snippet: str) -> None:
    facts = _facts()
    before = facts.model_dump_json()
    out = _fill(snippet, facts)
    assert "could not fill in" in out
    assert facts.model_dump_json() == before


def test_ordinary_templates_still_render() -> None:
    out = _fill(
        "{% for i in range(nproc) %}{{ i }},{% endfor %} {{ env.NCCL_DEBUG }} {{ facts.gpus.count }} {{ 'ab' * 3 }}"
    )
    assert out == "0,1, INFO 2 ababab"


def test_every_shipped_fix_renders_on_an_empty_and_a_full_snapshot() -> None:
    contexts = [render_context(Facts()), render_context(_facts())]
    problems = [
        f"{rule.id}: {fix.title}: {why}"
        for rule in load_kb().rules
        for fix in rule.fix
        if (why := lint_fix(fix.snippet, contexts))
    ]
    assert problems == []


def test_lint_names_the_problem() -> None:
    contexts = [render_context(Facts())]
    assert "ZeroDivisionError" in lint_fix("{{ 1/0 }}", contexts)
    assert "syntax error" in lint_fix("{% for %}", contexts)
    assert lint_fix("plain {{ nproc }}", contexts) is None
