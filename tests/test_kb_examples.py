"""Every rule proves itself: each example of every kb/ rule, one test each.

Test ids are ``<rule-id>::<example>``, so ``pytest -k nccl.p2p`` runs one rule's examples.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from diagnose.kb import KBError, load_kb
from diagnose.kbtest import example_name, run_example

ROOT = Path(__file__).resolve().parents[1]


def _cases():
    try:
        kb = load_kb()
    except KBError as exc:
        return [pytest.param(None, None, 0, exc, id="kb-loads")]
    return [
        pytest.param(rule, example, i, None, id=f"{rule.id}::{example_name(example, i)}")
        for rule in kb.rules
        for i, example in enumerate(rule.examples)
    ]


def pytest_generate_tests(metafunc):
    if "example" in metafunc.fixturenames:
        metafunc.parametrize(("rule", "example", "index", "load_error"), _cases())


def test_example(rule, example, index, load_error):
    assert load_error is None, "\n".join(load_error.problems)
    result = run_example(rule, example, index)
    assert result.ok, f"{result.rule}::{result.name} (expect {result.expect}): {result.message}"


def test_causes_of_shared_are_all_covered():
    causes = ROOT.parent / "shared" / "causes.yaml"
    if not causes.is_file():
        pytest.skip("../shared/causes.yaml is not beside this checkout")
    import yaml

    wanted = set(yaml.safe_load(causes.read_text()))
    have = {r.id for r in load_kb().rules}
    assert not wanted - have, f"rules missing for: {sorted(wanted - have)}"


def test_rules_doc_is_fresh():
    from diagnose.kbdocs import render_rules_markdown

    current = (ROOT / "docs" / "rules.md").read_text(encoding="utf-8")
    assert current == render_rules_markdown(load_kb()), "docs/rules.md is stale: run `diagnose kb docs`"
