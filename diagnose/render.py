"""Views of a Report: JSON (for CI), text (rich, for a terminal) and markdown (for an issue)."""

from __future__ import annotations

import io
import json
import textwrap
from typing import Any

from diagnose.report import EvidenceItem, Finding, Report, SymptomSeen

FORMATS = ("text", "json", "markdown")
SEVERITY_STYLE = {"error": "bold red", "warning": "yellow", "info": "cyan"}


def safe_report(report: Report, *, controls: bool = True) -> Report:
    """The report as it may leave the tool: every string through the one redactor and, for
    a terminal or a markdown page (``controls``), without escape sequences or control
    characters. Done on the model, before any wrapping could split a token across lines."""
    from probes.redact import scrub

    return Report.model_validate(scrub(report.model_dump(mode="json", warnings=False), controls=controls))


def render(report: Report, fmt: str = "text", *, width: int = 80, color: bool = False) -> str:
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r} (one of {', '.join(FORMATS)})")
    # JSON escapes control characters itself; the values stay as the input had them
    report = safe_report(report, controls=fmt != "json")
    if fmt == "json":
        return render_json(report)
    if fmt == "markdown":
        return render_markdown(report)
    return render_text(report, width=width, color=color)


def render_json(report: Report) -> str:
    return report.model_dump_json(indent=2, warnings=False) + "\n"


def _value(value: Any) -> str:
    if value is None:
        return "unknown"
    if isinstance(value, (list, dict)):
        text = json.dumps(value, default=str)
    else:
        text = str(value)
    return text if len(text) <= 60 else text[:57] + "..."


def machine_summary(report: Report) -> list[tuple[str, str]]:
    """The machine at a glance: (label, value) pairs shared by the text, markdown and TUI views."""
    f = report.facts
    rows: list[tuple[str, str]] = []
    if f.gpus.devices:
        names: dict[str, int] = {}
        for gpu in f.gpus.devices:
            names[gpu.name or "?"] = names.get(gpu.name or "?", 0) + 1
        rows.append(("GPUs", ", ".join(f"{n}x {name}" for name, n in names.items())))
    elif f.gpus.count is not None:
        rows.append(("GPUs", str(f.gpus.count)))
    else:
        reason = f.gpus.unavailable.get("count") or next(iter(f.gpus.unavailable.values()), "not probed")
        rows.append(("GPUs", f"unknown ({reason})"))
    if f.driver.version or f.driver.cuda_version:
        rows.append(("Driver", f"{f.driver.version or '?'} (CUDA {f.driver.cuda_version or '?'})"))
    if f.torch.version:
        build = f"CUDA {f.torch.cuda}" if f.torch.cuda else "CPU build"
        extra = f", NCCL {f.torch.nccl}" if f.torch.nccl else ""
        rows.append(("torch", f"{f.torch.version} ({build}{extra})"))
    else:
        known, version = f.packages.lookup("torch")
        rows.append(("torch", version or ("not installed" if known else "unknown")))
    versions = f.packages.values
    lightning = [f"{n} {versions[n]}" for n in ("lightning", "pytorch-lightning") if n in versions]
    if lightning:
        rows.append(("Lightning", ", ".join(lightning)))
    strategy = [
        f"{n} {versions[n]}"
        for n in ("deepspeed", "accelerate", "bitsandbytes", "transformers", "peft")
        if n in versions
    ]
    if strategy:
        rows.append(("Also", ", ".join(strategy)))
    if f.launcher.kind:
        world = f" (world size {f.launcher.world_size})" if f.launcher.world_size else ""
        rows.append(("Launcher", f.launcher.kind + world))
    if f.inputs:
        rows.append(("Inputs", ", ".join(f.inputs)))
    return rows


def microtest_rows(report: Report) -> list[tuple[str, str, str]]:
    """(test, status, detail) for each micro-test that ran or was skipped."""
    rows = []
    tests = report.facts.microtests
    for name in type(tests).model_fields:
        test = getattr(tests, name)
        if name in ("source", "unavailable") or test is None:
            continue
        error_lines = (test.error or "").strip().splitlines()
        problem = test.reason or (error_lines[0] if error_lines else "")
        # a snapshot from one rank may carry nccl-tests' busbw of 0: no bus was crossed
        busbw = test.measurements.get("busbw_gbps_max") if (test.nproc or 0) > 1 else None
        where = f"{test.nproc} rank{'s' * (test.nproc != 1)}, {test.backend}" if test.nproc and test.backend else ""
        detail = problem or ", ".join(
            part
            for part in (
                where,
                f"busbw up to {busbw:.2f} GB/s" if isinstance(busbw, (int, float)) else "",
                f"{test.duration_s:.1f} s" if test.duration_s else "",
            )
            if part
        )
        rows.append((name, test.status, detail))
    return rows


def narrowing_checks(report: Report) -> list[str]:
    """When symptoms are clear but no cause has evidence of its own: what narrows them down."""
    if not report.symptoms or any(f.basis == "evidence" for f in report.findings):
        return []
    return list(dict.fromkeys(s.check for s in report.symptoms))


def symptom_line(symptom: SymptomSeen) -> str:
    return f"{symptom.title} (from {', '.join(symptom.shown_by[:3])})"


def fired(finding: Finding) -> list[EvidenceItem]:
    return [e for e in finding.evidence if e.state == "fired"]


# --- text ---------------------------------------------------------------------------------------


def render_text(report: Report, *, width: int = 80, color: bool = False) -> str:
    from rich.console import Console
    from rich.markup import escape
    from rich.padding import Padding
    from rich.syntax import Syntax
    from rich.table import Table

    buffer = io.StringIO()
    console = Console(
        file=buffer, width=width, force_terminal=color, no_color=not color, highlight=False, soft_wrap=False
    )
    console.print(f"[bold]lightning-diagnose {report.tool.get('version', '')}[/]")
    table = Table.grid(padding=(0, 2))
    for label, value in machine_summary(report):
        table.add_row(f"[dim]{label}[/]", escape(value))
    console.print(table)
    console.print()

    if report.symptoms:
        console.print("[bold]What happened[/]")
        for symptom in report.symptoms:
            console.print(Padding(escape(symptom_line(symptom)), (0, 0, 0, 2)))
        checks = narrowing_checks(report)
        if checks:
            console.print(
                "No cause has evidence of its own yet: the candidates below are the usual causes "
                "of this. To tell them apart:"
            )
            for check in checks:
                console.print(Padding(escape(f"- {check}"), (0, 0, 0, 2)))
        console.print()
    if report.findings:
        console.print(f"[bold]Likely causes, most likely first ({len(report.findings)})[/]")
    else:
        console.print("[bold green]No likely cause found.[/] Nothing in the rule base fired on these facts.")
    for rank, finding in enumerate(report.findings, 1):
        style = SEVERITY_STYLE[finding.severity]
        console.print()
        heading = textwrap.fill(f"{rank}. {finding.title}", width=width, subsequent_indent="   ")
        console.print(
            f"[bold]{escape(heading)}[/]\n"
            f"   [{style}]{finding.severity}[/] · {finding.confidence} confidence · "
            f"score {finding.score:g} · [dim]{finding.id}[/]"
        )
        console.print(Padding(escape(finding.explain), (0, 0, 0, 3)))
        if finding.check:
            console.print(Padding(f"Check: {escape(finding.check)}", (0, 0, 0, 3)))
        for item in fired(finding):
            label = f" ({escape(item.label)})" if item.label else ""
            console.print(
                Padding(f"[green]✓[/] {escape(item.what)}: {escape(_value(item.observed))}{label}", (0, 0, 0, 3))
            )
            for line in item.lines:
                console.print(Padding(f"[dim]{escape(line)}[/]", (0, 0, 0, 6)))
        for fix in finding.fixes[:1]:
            console.print(Padding(f"Fix: {escape(fix.title)}", (0, 0, 0, 3)))
            console.print(
                Padding(Syntax(fix.snippet.rstrip(), fix.language, theme="ansi_dark", word_wrap=True), (0, 0, 0, 5))
            )
        if len(finding.fixes) > 1:
            console.print(
                Padding(f"[dim]+{len(finding.fixes) - 1} more fix(es) in --format markdown/json[/]", (0, 0, 0, 3))
            )
        urls = [ref for ref in finding.references if ref.startswith("http")]
        if urls:
            console.print(Padding(f"[dim]See {escape(urls[0])}[/]", (0, 0, 0, 3)))

    checks = microtest_rows(report)
    if checks:
        console.print()
        console.print("[bold]Micro-tests[/]")
        grid = Table.grid(padding=(0, 2))
        for name, status, detail in checks:
            style = {"passed": "green", "skipped": "dim"}.get(status, "bold red")
            grid.add_row(f"  {name}", f"[{style}]{status}[/]", escape(detail))
        console.print(grid)
    console.print()
    console.print(
        f"[dim]{len(report.possible)} possible but unconfirmed, {len(report.not_checked)} not checked, "
        f"{len(report.ruled_out)} ruled out, of {report.summary.rules} rules.[/]"
    )
    if report.possible:
        console.print(f"[dim]Possible: {escape(', '.join(o.id for o in report.possible))}[/]")
    for skip in report.skipped:
        console.print(f"[dim]Skipped {escape(skip.what)}: {escape(skip.reason)}[/]")
    for error in report.probe_errors:
        console.print(f"[yellow]Probe error[/] {escape(error.probe)}: {escape(error.message)}")
    # rich pads every line to the width; trailing blanks only get in the way of a paste
    return "\n".join(line.rstrip() for line in buffer.getvalue().splitlines()) + "\n"


# --- markdown -------------------------------------------------------------------------------------


def md_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render_markdown(report: Report) -> str:
    out: list[str] = [f"## lightning-diagnose {report.tool.get('version', '')}", ""]
    out += ["| | |", "|---|---|"]
    out += [f"| {label} | {md_cell(value)} |" for label, value in machine_summary(report)]
    out.append("")
    if report.symptoms:
        out += ["**What happened**", ""] + [f"- {symptom_line(s)}" for s in report.symptoms] + [""]
        checks = narrowing_checks(report)
        if checks:
            out += (
                [
                    "No cause has evidence of its own yet: the candidates below are the usual causes of this. "
                    "To tell them apart:",
                    "",
                ]
                + [f"- {c}" for c in checks]
                + [""]
            )
    if not report.findings:
        out += ["No likely cause found: nothing in the rule base fired on these facts.", ""]
    for rank, finding in enumerate(report.findings, 1):
        out += [
            f"### {rank}. {finding.title}",
            "",
            f"**{finding.severity}** · {finding.confidence} confidence · score {finding.score:g} · `{finding.id}`",
            "",
            finding.explain,
            "",
            *([f"Check: {finding.check}", ""] if finding.check else []),
            "| evidence | observed | expected | |",
            "|---|---|---|---|",
        ]
        for item in finding.evidence:
            mark = {"fired": "✅", "not_fired": "—", "unknown": "?"}[item.state]
            what = md_cell(item.label) if item.label else f"`{md_cell(item.what)}`"
            out.append(f"| {what} | {md_cell(_value(item.observed))} | {md_cell(item.expected)} | {mark} |")
        lines = [line for item in fired(finding) for line in item.lines]
        if lines:
            out += ["", "<details><summary>log lines</summary>", "", "```"] + lines + ["```", "</details>"]
        for fix in finding.fixes:
            out += ["", f"**Fix: {fix.title}**", "", f"```{fix.language}", fix.snippet.rstrip(), "```"]
        if finding.references:
            out += ["", "References: " + ", ".join(f"<{ref}>" for ref in finding.references)]
        out.append("")
    checks = microtest_rows(report)
    if checks:
        out += ["| micro-test | status | detail |", "|---|---|---|"]
        out += [f"| {name} | {status} | {md_cell(detail)} |" for name, status, detail in checks]
        out.append("")
    sections = [("Possible, unconfirmed", report.possible), ("Not checked", report.not_checked)]
    for heading, outcomes in sections:
        if outcomes:
            out += [f"<details><summary>{heading} ({len(outcomes)})</summary>", ""]
            out += [
                f"- `{o.id}`: {o.reason}" + (f" (needs {', '.join(o.missing)})" if o.missing else "") for o in outcomes
            ]
            out += ["", "</details>", ""]
    if report.skipped or report.probe_errors:
        out += ["<details><summary>Skipped and probe errors</summary>", ""]
        out += [f"- skipped {s.what}: {s.reason}" for s in report.skipped]
        out += [f"- error in {e.probe}: {e.message}" for e in report.probe_errors]
        out += ["", "</details>", ""]
    out.append(f"_{len(report.ruled_out)} of {report.summary.rules} rules ruled out._")
    return "\n".join(out) + "\n"
