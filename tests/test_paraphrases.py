"""One plain sentence per cause, in English and Chinese (tests/fixtures/paraphrases/): each ranks
its cause first. The held cases measure the tool on real reports; these keep the rarer causes
reachable in a user's own short words, where a batch of new reports may hold one or none. The
training frameworks' own messages (framework_messages.yaml, read from their source) rank theirs
first alone, and the lines their healthy runs print show no symptom."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from diagnose import diagnose_text
from diagnose.kb import load_kb

FIXTURES = Path(__file__).parent / "fixtures" / "paraphrases"
SENTENCES = yaml.safe_load((FIXTURES / "sentences.yaml").read_text("utf-8"))["sentences"]
FRAMEWORK_MESSAGES = yaml.safe_load((FIXTURES / "framework_messages.yaml").read_text("utf-8"))["messages"]


def _param(item: dict) -> object:
    marks = [pytest.mark.xfail(reason=item["known_miss"], strict=True)] if "known_miss" in item else []
    return pytest.param(item["cause"], item["text"], marks=marks, id=f"{item['cause']}:{item['text'][:40]}")


@pytest.mark.parametrize(("cause", "text"), [_param(item) for item in SENTENCES])
def test_a_plain_sentence_ranks_its_cause_first(cause, text):
    findings = diagnose_text(log=text).findings
    assert findings and findings[0].id == cause, [f.id for f in findings[:3]]


def test_every_shipped_cause_of_the_list_has_a_sentence():
    causes = set(yaml.safe_load((Path(__file__).resolve().parent.parent.parent / "shared" / "causes.yaml").read_text()))
    shipped = {rule.id for rule in load_kb().rules}
    missing = sorted((causes & shipped) - {item["cause"] for item in SENTENCES})
    assert not missing, missing


@pytest.mark.parametrize(
    ("cause", "text"), [pytest.param(m["cause"], m["text"], id=m["text"][:50]) for m in FRAMEWORK_MESSAGES]
)
def test_a_training_frameworks_own_message_ranks_its_cause_first(cause, text):
    report = diagnose_text(log=text)
    if cause is None:  # printed by healthy runs too
        assert not report.symptoms, [s.id for s in report.symptoms]
    else:
        assert report.findings and report.findings[0].id == cause, [f.id for f in report.findings[:3]]
