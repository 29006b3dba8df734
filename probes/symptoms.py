"""Symptoms: what happened, named from the facts before any cause is weighed.

``observe(facts)`` returns each symptom of the closed vocabulary (``kb/symptoms.yaml``) that
the facts show, with what showed it: a log signature (each signature lists its symptoms in
``kb/signatures/``), where the ranks of a hung job wait, or a micro-test that timed out. It is
a pure function of the facts, so a saved snapshot shows the same symptoms when read again.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from probes.signatures import shipped

if TYPE_CHECKING:  # Facts derives its symptoms from here: a type only, no import cycle
    from probes.facts import Facts, Log

# where a hung rank waits (probes.hang's waiting_in) -> the symptom: before training starts,
# or in a collective
_INIT_WAITS = {"rendezvous", "init_process_group", "load", "verify_params"}
# signatures of a failure (an exception, a launcher's report of a dead rank): a log holding one did
# not simply stop
_FAILURES = {"python_exception", "process_exit", "child_failed", "sigkill_exit"}
_HANG_TIMEOUT_TESTS = {"rendezvous": "hang.init", "barrier": "hang.collective", "all_reduce": "hang.collective"}


def observe(facts: Facts) -> dict[str, list[str]]:
    """Symptom id -> what showed it (``log ID``, ``stack in PLACE``, ``micro-test NAME timed out``)."""
    seen: dict[str, list[str]] = {}

    def add(symptom: str, source: str) -> None:
        sources = seen.setdefault(symptom, [])
        if source not in sources:
            sources.append(source)

    catalog = shipped().signatures
    for sig in facts.log.signatures or ():
        definition = catalog.get(sig.id)
        for symptom in definition.symptoms if definition else ():
            add(symptom, f"log {sig.id}")
    hang = facts.hang
    if hang.detected and hang.ranks:
        places = {r.waiting_in or "unknown" for r in hang.ranks}
        symptom = "hang.init" if places <= _INIT_WAITS else "hang.collective"
        for place in sorted(places):
            add(symptom, f"stack in {place}")
    elif hang.detected:
        add("hang", "no progress")
    for name, symptom in _HANG_TIMEOUT_TESTS.items():
        test = getattr(facts.microtests, name)
        if test is not None and test.status == "timed_out":
            add(symptom, f"micro-test {name} timed out")
    # a launcher that reports a rank's end with a failing code or a signal (torchrun's "failed
    # (exitcode: -7)", DeepSpeed's "exits with return code = 1") saw that rank die
    failed = next((c for c in facts.log.exit_codes or () if c != 0), None)
    if failed is not None:
        add("crash.rank-exited", f"a rank ended with exit code {failed}")
    if facts.launcher.ranks_short_of_devices:
        add("gpus-missing", "fewer ranks formed the group than devices were requested")
    # Lightning's banner "GPU available: False" is what a CPU run prints too: a missing GPU only in
    # a job whose log otherwise names GPUs, CUDA or NCCL
    if facts.log.mentions_gpu and any(s.id == "lightning_no_gpu" for s in facts.log.signatures or ()):
        add("gpus-missing", "Lightning sees no GPU in a job that names GPUs")
    symptoms = shipped().symptoms
    # a reader's "it does not work" (a fallback) over a log that stops after start-up is that stop
    if all(symptoms[s].fallback for s in seen):
        if _stops_after_startup(facts):
            add("hang.collective", "log ends after start-up, with no error")
        if facts.log.ends_out_of_data:
            add("hang.collective", "log ends as ranks run out of data, with no error")
    if any(not symptoms[s].fallback for s in seen):
        seen = {s: sources for s, sources in seen.items() if not symptoms[s].fallback}
    # a hang told in words over a log that ends while a rank was still joining the group
    if "hang" in seen and facts.log.ends_joining_group:
        add("hang.init", "log ends while the process group forms")
    return _most_specific(seen)


# a pasted log that ends within this many lines of start-up's last milestone ends there
_TAIL = 8
# a rank starting to join the process group (Lightning's banner, DeepSpeed's init_distributed, a
# script's printed rendezvous arguments), and start-up complete
_JOINING = {"lightning_ddp_init", "deepspeed_dist_init", "rank_init_args"}
_JOINED = {"startup_done", "lightning_all_registered"}


def _ends_at(log: Log, marks: set[str], undone_by: set[str]) -> bool:
    """Whether a log's last event is a signature of ``marks``: one of them lies within ``_TAIL``
    lines of the end, and no signature of ``undone_by`` comes on or after the last of them."""
    signatures, lines = log.signatures, log.lines
    if not signatures or not lines:
        return False
    at = [s.line for s in signatures if s.id in marks]
    if not at or any(s.line >= max(at) for s in signatures if s.id in undone_by):
        return False
    return lines[-1].no - max(at) <= _TAIL


def _stops_after_startup(facts: Facts) -> bool:
    """A log whose last event is start-up completing (every rank joined, NCCL init done), with
    no error anywhere: the job stopped before its first step, the state of a hang at the first
    collective that a user pastes without saying it hangs."""
    if any(s.id in _FAILURES for s in facts.log.signatures or ()):
        return False
    return _ends_at(facts.log, {"startup_done"}, set())


def ends_out_of_data(log: Log) -> bool:
    """Whether a log's last events are ranks saying their data ran out, with no failure after
    (``Log.ends_out_of_data``): a job that goes on logs more after them."""
    return _ends_at(log, {"rank_end_of_data"}, _FAILURES)


def ends_joining_group(log: Log) -> bool:
    """Whether a log's last event is a rank starting to join the process group, never followed
    by the group forming or by a failure (``Log.ends_joining_group``)."""
    return _ends_at(log, _JOINING, _JOINED | _FAILURES)


def _most_specific(seen: dict[str, list[str]]) -> dict[str, list[str]]:
    """Drop a symptom a more specific observed one refines ("timeout" once "timeout.collective"
    is seen), handing its sources on: the vaguer one would make candidates of causes the
    specific one already excludes (a rendezvous failure for a collective that timed out)."""
    out: dict[str, list[str]] = {}
    for symptom, sources in seen.items():
        finer = [s for s in seen if s.startswith(symptom + ".")]
        if not finer:
            out.setdefault(symptom, [])
            out[symptom].extend(x for x in sources if x not in out[symptom])
            continue
        for s in finer:
            if not any(s2.startswith(s + ".") for s2 in seen):
                target = out.setdefault(s, [])
                target.extend(x for x in sources if x not in target)
    for symptom in out:
        for x in seen.get(symptom, []):
            if x not in out[symptom]:
                out[symptom].append(x)
    return out
