"""One plain sentence per cause, in English and Chinese (tests/fixtures/paraphrases/): each ranks
its cause first. The held cases measure the tool on real reports; these keep the rarer causes
reachable in a user's own short words, where a batch of new reports may hold one or none."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from diagnose import diagnose_text
from diagnose.kb import load_kb

SENTENCES = yaml.safe_load((Path(__file__).parent / "fixtures" / "paraphrases" / "sentences.yaml").read_text("utf-8"))[
    "sentences"
]


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
