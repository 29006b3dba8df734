"""What happened to the job, in a few lines for stderr: stdout carries only the report."""

from __future__ import annotations

from pathlib import Path

from diagnose.run.facts import first_failing_rank
from diagnose.run.result import RunResult


def summary_lines(result: RunResult, facts, out: Path) -> list[str]:
    """What happened, for stderr: stdout carries only the report."""
    lines = []
    if result.outcome == "hung":
        ranks = facts.hang.ranks or []
        methods = sorted({r.method for r in ranks if r.method})
        lines.append(
            f"no progress for {result.idle_s:g}s: the job is hung; stacks of {sum(r.method is not None for r in ranks)}"
            f" of {len(ranks)} rank(s) taken with {', '.join(methods) or 'nothing'}"
        )
        for rank in ranks:
            lines.append(f"  rank {_rank_name(rank)}: {_where(rank)}")
        if facts.hang.sequence not in (None, "in-step"):
            lines.append(f"  flight recorder, read as a sequence: {SEQUENCE_WORDS[facts.hang.sequence]}")
        for call in facts.hang.rank_zero_calls or []:
            lines.append(f"  source: {call.call} at {call.file}:{call.line} runs only under `{call.condition}`")
        for straggler in facts.hang.stragglers or []:
            if straggler.ops:
                calls = ", ".join(f"{op} on rank {rank}" for rank, op in straggler.ops.items())
                lines.append(f"  flight recorder: collective #{straggler.seq} differs across ranks: {calls}")
            else:
                lines.append(
                    f"  flight recorder: {straggler.op or 'collective'} #{straggler.seq} entered by rank(s) "
                    f"{_ranks(straggler.entered)}, never by {_ranks(straggler.missing)}"
                )
        lines.extend(f"  {note}" for note in result.notes)
        if result.kept_pid is not None:
            lines.append(f"  left running (--keep): the job's process group is {result.kept_pid}")
        if facts.hang.unavailable:
            lines.extend(f"  {why}" for why in facts.hang.unavailable.values())
    elif result.outcome == "finished":
        lines.append(f"the job finished (exit {result.exit_code})")
    else:
        what = "was interrupted" if result.outcome == "interrupted" else "failed"
        first = first_failing_rank(facts)
        lines.append(
            f"the job {what} (exit {result.exit_code})"
            + (f"; first failing rank: {first}" if first is not None else "")
        )
        failure = facts.hang.first_failure
        if failure is not None and failure.exception:
            at = f" at {failure.user_frame.file}:{failure.user_frame.line}" if failure.user_frame else ""
            lines.append(f"  its exception: {failure.exception}: {(failure.message or '')[:160]}{at}")
    lines.append(f"log, report and dumps saved in {out}")
    return lines


SEQUENCE_WORDS = {
    "uneven-iterations": "every rank repeated the same collectives until some ranks ran one more step (uneven batches)",
    "size-mismatch": "the ranks called one collective with tensors of different shapes",
    "different-ops": "the ranks called different collectives at the same point (divergent code)",
    "rank-behind": "some ranks have not issued the collective the others wait in",
}


def _where(rank) -> str:
    """One rank's place: what it does, the user's line, and the library call it is in."""
    at = f" at {rank.user_frame.file}:{rank.user_frame.line}" if rank.user_frame else ""
    via = f" (in {rank.library_frame.function})" if rank.library_frame and rank.library_frame.function else ""
    if rank.activity == "exited":
        return "exited while the others still ran"
    if rank.activity in ("compute", "io", "data") and rank.waiting_in in ("user_code", "other"):
        return f"busy in its own work{at}"
    return f"waits in {rank.waiting_in or 'unknown'}{at}{via}"


def _rank_name(rank) -> str:
    if rank.rank is not None:
        return str(rank.rank)
    return f"? (local {rank.local_rank}, pid {rank.pid})" if rank.local_rank is not None else f"? (pid {rank.pid})"


def _ranks(ranks: list[int]) -> str:
    return ", ".join(map(str, ranks)) or "none"
