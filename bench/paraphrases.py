"""The written reports: short bug reports per cause of causes.yaml, written blind (by someone who
read only the cause list, never the rules) in a user's words. Sets A and B (four per cause): a
plain description, a terse or misspelt one, one in Chinese (a few in Japanese or Korean) and one
led by a pasted log; sets C and D (three per cause, a second writer): a downstream repository's
issue template with a partial environment and log, the same in Chinese, Japanese or Korean, and a
short vague one; sets E and F (three per cause, a third writer, asked for what makes real
threads hard): a report whose evidence is indirect (the system's state or a partial log, with a
red herring), a Chinese forum post (a few Japanese or Korean), and a thin one with a single
concrete clue; sets G and H (three per cause, a fourth writer, six styles split between them): a
Stack Overflow question whose clue sits in the code, a hurried chat message with misspellings, an
issue that is mostly what was already tried, a pasted log with one line of question, a Chinese
(a few Japanese or Korean) forum post, and a second-hand report by a colleague or support person;
sets I and J (a fifth writer, eight per cause in each): only the seven causes the held-out sets
ranked worst (``--by-cause``), each report hinging on a different clue, in mixed styles;
sets K and L (a sixth writer, eight per cause in each): the same seven causes, each of its sixteen
reports on yet another clue; set M (a seventh writer): two per cause, one in English and one in
Chinese, each on a clue of the writer's choosing; set N (an eighth writer): one Chinese report
per cause. They measure how the reader takes wordings no real case held yet.

A, C, E, G, I, K and N are development sets: their misses may guide general fixes (vocabulary, library
messages), never a pattern copied from their text. B, D, F, H, J, L and M are held out: scored, not read. The
blind scores and each later score are in ``bench/paraphrases.csv``; ``tests/test_paraphrases.py``
keeps a floor under each set, and under the symptom phrases (``bench/phrases.csv``), whose shares
its assertion messages print.

    python bench/paraphrases.py              # shares per set, per language and per style
    python bench/paraphrases.py --misses a   # a development set's misses: cause, rank, first three findings
    python bench/paraphrases.py --by-cause   # per cause, the share ranked first over the held-out sets
                                             # (counts only: the weakest causes, without reading a report)
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from diagnose import diagnose_text  # noqa: E402
from diagnose.kb import load_kb  # noqa: E402

SETS = {name: ROOT / "tests" / "fixtures" / "paraphrases" / f"reports-{name}.yaml" for name in "abcdefghijklmn"}
DEVELOPMENT = "acegikn"  # the others are held out: --misses does not list them


def ranks(path: Path) -> list[tuple[dict, int | None, list[str]]]:
    """Each report with the rank of its cause among the findings (None: not a finding)."""
    kb, out = load_kb(), []
    for report in yaml.safe_load(path.read_text("utf-8"))["reports"]:
        ids = [f.id for f in diagnose_text(log=report["text"], kb=kb).findings]
        out.append((report, ids.index(report["cause"]) + 1 if report["cause"] in ids else None, ids[:3]))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--misses", choices=sorted(DEVELOPMENT), help="list a development set's misses")
    parser.add_argument("--by-cause", action="store_true", help="per cause, over the sets named (default: held out)")
    parser.add_argument("sets", nargs="*", metavar="SET", help=f"only these of {', '.join(SETS)} (default: all)")
    args = parser.parse_args()
    unknown = sorted(set(args.sets) - set(SETS))
    if unknown:
        parser.error(f"no written set {', '.join(unknown)}: the sets are {', '.join(SETS)}")
    if args.by_cause:
        total: dict[str, int] = defaultdict(int)
        first: dict[str, int] = defaultdict(int)
        for name in args.sets or [n for n in SETS if n not in DEVELOPMENT]:
            for report, rank, _ in ranks(SETS[name]):
                total[report["cause"]] += 1
                first[report["cause"]] += rank == 1
        for cause in sorted(total, key=lambda c: (first[c] / total[c], c)):
            print(f"{cause:40} {first[cause]:4} of {total[cause]:3}  {first[cause] / total[cause]:5.0%}")
        return
    if args.misses:
        for i, (report, rank, top) in enumerate(ranks(SETS[args.misses])):
            if rank != 1:
                print(f"{i:4} {report['cause']:34} {report.get('lang', '?'):3} {rank or '-':>2}  {', '.join(top)}")
        return
    print(f"{'set':4} {'group':5} {'n':>4} {'first':>6} {'top 3':>6} {'none':>5}")
    for name, path in SETS.items():
        if args.sets and name not in args.sets:
            continue
        groups: dict[str, list] = defaultdict(list)
        for report, rank, top in ranks(path):
            groups["all"].append((rank, top))
            groups[report.get("lang", "?")].append((rank, top))
            if "style" in report:
                groups[report["style"]].append((rank, top))
        for group, rows in sorted(groups.items(), key=lambda kv: (kv[0] != "all", kv[0])):
            n = len(rows)
            first = sum(r == 1 for r, _ in rows) / n
            top3 = sum(r is not None and r <= 3 for r, _ in rows) / n
            print(f"{name:4} {group:5} {n:4} {first:6.0%} {top3:6.0%} {sum(not t for _, t in rows):5}")


if __name__ == "__main__":
    main()
