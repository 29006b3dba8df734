"""`diagnose kb ...`: lint, list, show, test, docs and new over the rule base."""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import yaml

from diagnose import kblint
from diagnose.contract import Exit, UsageError
from diagnose.kb import KBError, load_kb
from diagnose.rules import Rule


def lint(args: argparse.Namespace) -> int:
    try:
        kb = load_kb(args.kb)
    except KBError as exc:
        for problem in exc.problems:
            print(problem, file=sys.stderr)
        print(f"diagnose: error: {len(exc.problems)} problem(s) in the rule base", file=sys.stderr)
        return Exit.USAGE
    return kblint.report(kb)


def list(args: argparse.Namespace) -> int:  # noqa: A001 - the subcommand's name
    kb = load_kb(args.kb)
    width = max(len(rule.id) for rule in kb.rules)
    for rule in kb.rules:
        print(f"{rule.id:<{width}}  {rule.severity:<7}  {rule.title}")
    return Exit.OK


def show(args: argparse.Namespace) -> int:
    kb = load_kb(args.kb)
    rule = kb.get(args.id)
    if rule is None:
        raise UsageError(f"no rule '{args.id}' (see `diagnose kb list`)")
    sys.stdout.write(kb.files[rule.id].read_text(encoding="utf-8"))
    return Exit.OK


def test(args: argparse.Namespace) -> int:
    from diagnose.kbtest import run_all

    results = run_all(load_kb(args.kb))
    failed = [r for r in results if not r.ok]
    for r in failed:
        print(f"FAIL {r.rule}::{r.name} (expect {r.expect}): {r.message}")
    print(f"{len(results) - len(failed)} passed, {len(failed)} failed")
    return Exit.FINDINGS if failed else Exit.OK


def docs(args: argparse.Namespace) -> int:
    from diagnose.kbdocs import render_rules_markdown

    text = render_rules_markdown(load_kb(args.kb))
    out = Path(args.out)
    if args.check:
        current = out.read_text(encoding="utf-8") if out.is_file() else ""
        if current != text:
            print(f"diagnose: error: {out} is stale: run `diagnose kb docs --out {out}`", file=sys.stderr)
            return Exit.FINDINGS
        print(f"{out} is up to date")
        return Exit.OK
    out.write_text(text, encoding="utf-8")
    print(f"wrote {out}")
    return Exit.OK


def paths(args: argparse.Namespace) -> int:
    from diagnose.paths import known_paths

    print("\n".join(known_paths()))
    return Exit.OK


SKELETON = {
    "title": "TODO: the cause in one line, as a user would say it",
    "severity": "error",
    "explains": ["hang"],  # the symptoms of kb/symptoms.yaml this cause produces
    "prior": 0.17,
    "status": "preview",
    "since": None,
    "when": [],
    "evidence": [{"log": "TODO: the error text users see", "weight": 6}],
    "explain": "TODO: why this happens, in two or three sentences.",
    "fix": [{"title": "TODO", "kind": "code", "language": "python", "snippet": "# TODO\n"}],
    "references": ["https://github.com/TODO/issues/0"],
    "examples": [
        {"name": "reported", "expect": "match", "log": "TODO: the error text users see"},
        {"name": "unrelated", "expect": "no-match", "log": "Epoch 0: 100%"},
    ],
}


def new(args: argparse.Namespace) -> int:
    from diagnose import __version__

    parts = args.id.split(".")
    if not re.fullmatch(Rule.model_fields["id"].metadata[0].pattern, args.id):
        raise UsageError(
            f"'{args.id}' is not AREA.NAME in lower case letters, digits and dashes (e.g. nccl.p2p-broken)"
        )
    path = Path(args.dir, *parts[:-1], parts[-1] + ".yaml")
    if path.exists():
        raise UsageError(f"{path}: already exists")
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {"id": args.id, **SKELETON, "since": __version__}
    path.write_text(yaml.safe_dump(data, sort_keys=False, allow_unicode=True), encoding="utf-8")
    print(f"wrote {path}: fill in the TODOs, then `diagnose kb test`")
    return Exit.OK
