"""docs/rules.md generation: every rule documented, tables intact, output stable.

Freshness of the committed page is checked in tests/test_kb_examples.py.
"""

from __future__ import annotations

import re

import pytest

from diagnose.kb import KB, load_kb
from diagnose.kbdocs import render_rules_markdown
from diagnose.rules import Rule


@pytest.fixture(scope="module")
def shipped() -> KB:
    return load_kb()


@pytest.fixture(scope="module")
def page(shipped: KB) -> str:
    return render_rules_markdown(shipped)


def _rule(**over) -> Rule:
    data = {
        "id": "demo.pipes",
        "title": "A demo rule",
        "severity": "warning",
        "explains": ["crash.nccl"],
        "evidence": [{"log": "a|b `tick`", "weight": 6, "label": "x | y"}],
        "explain": "Why.",
        "fix": [{"title": "Do it", "kind": "shell", "language": "bash", "snippet": "echo {{ nproc }}\n"}],
        "references": ["https://example.org/issue/1"],
        "examples": [{"expect": "match", "log": "a"}, {"expect": "no-match", "log": "c"}],
    }
    data.update(over)
    return Rule.model_validate(data)


def _cells(row: str) -> list[str]:
    return re.split(r"(?<!\\)\|", row.strip().strip("|"))


def test_every_rule_has_its_section_title_and_references(shipped: KB, page: str) -> None:
    for rule in shipped.rules:
        section = page.split(f"\n## {rule.id}\n", 1)
        assert len(section) == 2, rule.id
        body = section[1].split("\n## ", 1)[0]
        assert rule.title in body
        assert "**Fix**" in body and "**Evidence**" in body
        for ref in rule.references:
            assert ref in body, (rule.id, ref)


def test_contents_links_every_rule_once(shipped: KB, page: str) -> None:
    for rule in shipped.rules:
        assert page.count(f"- [{rule.id}](#{rule.id.replace('.', '')})") == 1


def test_evidence_tables_keep_five_cells_despite_pipes_in_regexes(page: str) -> None:
    rows = [line for line in page.splitlines() if line.startswith("| ") and not line.startswith("| weight")]
    assert rows
    for row in rows:
        assert len(_cells(row)) == 5, row


def test_backticks_and_pipes_in_a_pattern_are_escaped() -> None:
    text = render_rules_markdown(KB(rules=[_rule()], sources=[]))
    row = next(line for line in text.splitlines() if line.startswith("| +6 "))
    assert "`` a\\|b `tick` ``" in row
    assert len(_cells(row)) == 5
    assert "echo {{ nproc }}" in text  # the template is shown as written, not rendered


def test_output_does_not_depend_on_rule_order() -> None:
    a, b = _rule(), _rule(id="demo.other", title="Another")
    assert render_rules_markdown(KB(rules=[a, b], sources=[])) == render_rules_markdown(KB(rules=[b, a], sources=[]))


def test_gate_and_aliases_are_shown() -> None:
    rule = _rule(when=[{"fact": "gpus.count", "ge": 2}], aliases=["demo.old"])
    text = render_rules_markdown(KB(rules=[rule], sources=[]))
    assert "**Applies when**" in text and "`gpus.count`: >= 2" in text
    assert "formerly: `demo.old`" in text


def test_every_symptom_and_signature_is_documented_with_its_rules(page):
    from probes.signatures import shipped as catalog

    symptoms = page[page.index("\n## Symptoms\n") : page.index("\n## Signatures\n")]
    signatures = page[page.index("\n## Signatures\n") :]
    for sid in catalog().symptoms:
        assert f"\n### {sid}\n" in symptoms, sid
    for sig in catalog().signatures:
        assert f"| `{sig}` |" in signatures, sig
    assert "[ddp.unused-parameters](#ddpunused-parameters)" in symptoms.split("\n### crash.ddp\n")[1].split("\n### ")[0]
