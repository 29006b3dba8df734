"""Loading the knowledge base: kb/**/*.yaml -> validated rules, with FILE:LINE errors.

YAML is read with PyYAML's safe loader at the node level so every value keeps the line
it came from; pydantic's error location is mapped back to that line.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from diagnose.rules import Rule


class KBError(Exception):
    """One or more rule files failed to load; ``problems`` holds one line each."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        more = f" (and {len(problems) - 1} more; see `diagnose kb lint`)" if len(problems) > 1 else ""
        super().__init__(problems[0] + more)


def shipped_kb_dir() -> Path:
    """kb/ inside an installed wheel, else the source checkout's kb/ beside the package."""
    from probes.signatures import kb_dir

    return kb_dir()


@dataclass
class KB:
    rules: list[Rule]
    sources: list[Path]
    files: dict[str, Path] = field(default_factory=dict)  # rule id -> file

    @property
    def log_literals(self) -> frozenset[str]:
        """The literals the rules' log patterns require: a long log keeps the lines holding one,
        so a rule fires on a 400,000-line log as on a 40-line one."""
        from diagnose.rules import LogCheck, parts

        def walk(checks) -> Iterator[str]:
            for check in checks:
                if isinstance(check, LogCheck):
                    yield from check.literals or ()
                yield from walk(parts(check))

        return frozenset(lit for rule in self.rules for lit in walk([*rule.when, *rule.evidence]))

    @functools.cached_property
    def log_patterns(self) -> Any:
        """Every rule's log patterns as one set, asked once per log which of them match in it."""
        from diagnose.rules import LogCheck, parts
        from probes.patterns import PatternSet

        def walk(checks) -> Iterator[str]:
            for check in checks:
                if isinstance(check, LogCheck):
                    yield check.log
                yield from walk(parts(check))

        return PatternSet((p for rule in self.rules for p in walk([*rule.when, *rule.evidence])), multiline=True)

    def get(self, rule_id: str) -> Rule | None:
        for rule in self.rules:
            if rule.id == rule_id or rule_id in rule.aliases:
                return rule
        return None


_PLAIN_TAGS = {"tag:yaml.org,2002:map", "tag:yaml.org,2002:seq"}
# A rule file is a few hundred values a dozen levels deep. The caps stop a hostile file
# (an alias bomb expands exponentially in a walk; deep nesting exhausts the stack) early.
MAX_FILE_BYTES = 1 << 20
MAX_DEPTH = 32
MAX_VALUES = 20_000


def _to_python(node: yaml.Node, loader: yaml.SafeLoader, loc: tuple, lines: dict[tuple, int], budget: list[int]) -> Any:
    lines[loc] = node.start_mark.line + 1
    budget[0] -= 1
    if budget[0] < 0:
        raise _YamlProblem(lines[loc], f"more than {MAX_VALUES} values (aliases expanding?)")
    if len(loc) > MAX_DEPTH:
        raise _YamlProblem(lines[loc], f"nested deeper than {MAX_DEPTH} levels")
    if not isinstance(node, yaml.ScalarNode) and node.tag not in _PLAIN_TAGS:
        # the safe constructor would refuse this too; say so instead of silently dropping the tag
        raise _YamlProblem(lines[loc], f"unsupported tag {node.tag!r}: rule files are plain data")
    if isinstance(node, yaml.MappingNode):
        out: dict[Any, Any] = {}
        for key_node, value_node in node.value:
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == "tag:yaml.org,2002:merge":
                # merge keys copy whole mappings (an exponential bomb of their own)
                raise _YamlProblem(key_node.start_mark.line + 1, "a key is plain text (no merge keys, no complex keys)")
            key = loader.construct_object(key_node, deep=True)
            if key in out:
                raise _YamlProblem(key_node.start_mark.line + 1, f"duplicate key '{key}'")
            out[key] = _to_python(value_node, loader, loc + (key,), lines, budget)
        return out
    if isinstance(node, yaml.SequenceNode):
        return [_to_python(item, loader, loc + (i,), lines, budget) for i, item in enumerate(node.value)]
    return loader.construct_object(node, deep=True)


class _YamlProblem(Exception):
    def __init__(self, line: int, message: str):
        self.line, self.message = line, message


def read_yaml(text: str, *, shipped: bool = False) -> tuple[Any, dict[tuple, int]]:
    """Parse one YAML document safely; returns (data, location -> line). ``shipped``: one of
    this package's own files, which may take the faster libyaml parser."""
    from probes.signatures import SHIPPED_YAML_LOADER

    loader = (SHIPPED_YAML_LOADER if shipped else yaml.SafeLoader)(text)
    try:
        node = loader.get_single_node()
        lines: dict[tuple, int] = {}
        data = None if node is None else _to_python(node, loader, (), lines, [MAX_VALUES])
        return data, lines
    except RecursionError:  # PyYAML's composer recurses once per level of nesting
        raise _YamlProblem(loader.line + 1, f"nested deeper than {MAX_DEPTH} levels") from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        raise _YamlProblem(mark.line + 1 if mark else 1, str(exc.problem or exc.context)) from None
    finally:
        loader.dispose()


def _place(loc: tuple, lines: dict[tuple, int]) -> tuple[int, str]:
    """Nearest recorded line for a pydantic error location, and a readable path."""
    from diagnose.rules import CHECK_KINDS

    # a discriminated union puts its tag ('fact', 'log', ...) after the list index; the
    # data has no such level, so drop it
    data_loc = tuple(
        part
        for i, part in enumerate(loc)
        if not (part in CHECK_KINDS and i > 0 and isinstance(loc[i - 1], int) and i + 1 < len(loc))
    )
    line = next((lines[data_loc[:i]] for i in range(len(data_loc), -1, -1) if data_loc[:i] in lines), 1)
    text = ""
    for part in data_loc:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return line, text


def _message(error: dict) -> str:
    msg = error["msg"]
    for prefix in ("Value error, ", "Assertion failed, "):
        if msg.startswith(prefix):
            msg = msg[len(prefix) :]
    if error["type"] == "extra_forbidden":
        msg = "unknown key"
    return msg


def load_rule_file(path: Path, root: Path) -> Rule:
    """Load one rule; raises KBError with ``FILE:LINE: place: message`` lines."""
    display = str(path)
    try:
        if path.stat().st_size > MAX_FILE_BYTES:
            raise KBError([f"{display}:1: larger than {MAX_FILE_BYTES >> 10} KiB: a rule file is small"])
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise KBError([f"{display}:1: cannot read: {exc}"]) from None
    try:
        data, lines = read_yaml(text, shipped=root == shipped_kb_dir())
    except _YamlProblem as exc:
        raise KBError([f"{display}:{exc.line}: invalid YAML: {exc.message}"]) from None
    if not isinstance(data, dict):
        raise KBError([f"{display}:1: a rule file holds one mapping (id, title, ...)"])
    try:
        rule = Rule.model_validate(data)
    except ValidationError as exc:
        problems = []
        for error in exc.errors():
            line, where = _place(error["loc"], lines)
            problems.append(
                f"{display}:{line}: {where}: {_message(error)}" if where else f"{display}:{line}: {_message(error)}"
            )
        raise KBError(problems) from None
    expected = ".".join(path.relative_to(root).with_suffix("").parts)
    if rule.id != expected:
        raise KBError(
            [f"{display}:{lines.get(('id',), 1)}: id: '{rule.id}' does not match its path (expected '{expected}')"]
        )
    return rule


# kb/ entries that are data rules read, not rules: the symptom vocabulary, the signature
# catalog (probes.signatures) and the knowledge tables
NOT_RULES = ("symptoms.yaml", "signatures", "tables")


def rule_files(root: Path) -> list[Path]:
    return [p for p in sorted(root.rglob("*.yaml")) if p.relative_to(root).parts[0] not in NOT_RULES]


def _folders(extra: Any) -> list[Path]:
    """Rule folders from what a caller passed: one path or a list of them; bytes paths decoded."""
    import os

    if isinstance(extra, (str, bytes, os.PathLike)):
        extra = [extra]  # one folder, not its characters
    try:
        items = list(extra)
    except TypeError:
        raise TypeError(f"rule folders: a path or a list of paths, not {type(extra).__name__}") from None
    folders = []
    for item in items:
        if isinstance(item, bytes):
            item = os.fsdecode(item)
        if not isinstance(item, (str, os.PathLike)):
            raise TypeError(f"rule folder: a path, not {type(item).__name__} ({item!r:.40})")
        folders.append(Path(item))
    return folders


def load_kb(extra: list[str | Path] | tuple = (), *, shipped: bool = True) -> KB:
    """The shipped rules plus every ``*.yaml`` under each extra folder; all-or-nothing."""
    from probes.signatures import CatalogError
    from probes.signatures import shipped as shipped_catalog

    try:  # every rule names its symptoms and signatures from it: a broken one is said once
        shipped_catalog()
    except CatalogError as exc:
        raise KBError(exc.problems) from None
    roots = ([shipped_kb_dir()] if shipped else []) + _folders(extra)
    rules: list[Rule] = []
    files: dict[str, Path] = {}
    problems: list[str] = []
    for root in roots:
        if not root.is_dir():
            problems.append(f"{root}: not a rule folder")
            continue
        for path in rule_files(root):
            try:
                rule = load_rule_file(path, root)
            except KBError as exc:
                problems.extend(exc.problems)
                continue
            for name in [rule.id, *rule.aliases]:
                if name in files:
                    problems.append(f"{path}:1: id: '{name}' already defined in {files[name]}")
            files.setdefault(rule.id, path)
            for alias in rule.aliases:
                files.setdefault(alias, path)
            rules.append(rule)
    if problems:
        raise KBError(problems)
    rules.sort(key=lambda r: r.id)
    return KB(rules=rules, sources=roots, files={r.id: files[r.id] for r in rules})
