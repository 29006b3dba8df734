"""Read a training log or a pasted traceback into ``Facts.log``.

``read_log(source, name)`` takes a path (``-`` is stdin), a text or binary file object, or
an iterable of lines, and streams it in blocks, so a multi-GB log is read in constant
memory. It returns a ``Log`` with

* ``lines``: every line when the log has at most ``SHORT_LOG_LINES`` lines; for a longer
  log a bounded selection: the first ``HEAD_LINES`` and last ``TAIL_LINES`` lines, every
  line that looks relevant (an error signature, an error/warning/timeout word) with
  ``CONTEXT`` lines either side, and Python tracebacks from their ``Traceback (most recent
  call last):`` line to the exception (at most ``TRACEBACK_LINES``). At most
  ``MAX_RETAINED`` relevant lines are kept: the first half and the last half.
* ``signatures``: each occurrence of a known error signature (``SIGNATURES`` below), with
  the line, an excerpt, the rank and the named groups of its pattern; at most
  ``MAX_PER_SIGNATURE`` per (id, rank) and ``MAX_SIGNATURES`` in all, first ones kept.
  Signatures are searched in the first ``EXAMINE_CHARS`` characters of a line.

Lines are attributed to a rank where the launcher says so: a ``[rank3]:`` prefix (torch
2.2+), a SLURM ``srun --label`` prefix (``3: ...``), an Open MPI ``--tag-output`` prefix
(``[1,3]<stdout>:``, SageMaker's ``[1,mpirank:3,algo-1]<stdout>:``), a ``[rank: 3]``
Lightning prefix, the ``[Rank 3]`` / ``[PG 0 Rank 3]`` tag of ProcessGroupNCCL messages,
and the ``rank : 3`` lines of torchrun's ``ChildFailedError`` summary (whose "Root Cause"
entry also gives ``child_failed`` its ``first_failing_rank``). torchrun's ``--tee`` prefix
(``[default3]:``) names a *local* rank; it goes to ``data["local_rank"]``, not ``rank``.
Line text is kept as written, prefixes included, except that credentials are blanked
(``probes.env.redact_text``: ``HF_TOKEN=...``, ``--api-key X``, key-shaped tokens) in kept
lines, excerpts and data; a line with carriage returns (progress bars) keeps only what a
terminal would show, its last non-empty ``\\r`` segment.

Input policy: bytes are decoded as UTF-8 with replacement characters (a UTF-16 or UTF-8
byte-order mark selects that codec), so mixed encodings and text in another encoding
(GBK, latin-1) read without raising, their ASCII intact. A log whose start is binary (NUL
or other control characters in more than 5% of its first 64 KiB, judged once there are
256 characters; random or compressed bytes give about 10%) raises ``LogError`` with a
one-line message naming the source; binary junk later in a text log is decoded with
replacement characters. A line longer than ``MAX_LINE_CHARS`` bytes is cut into pieces.

Cost: the reader works on blocks of ``BLOCK_BYTES`` of UTF-8 and decodes only the lines it
looks at. One RE2 pass per block over the signatures' own patterns, their capturing groups
dropped (plus the reader's state lines: tracebacks, torchrun's summary), finds the lines a
signature can match and counts the block's lines on the way; a second pass over the relevant
words and the caller's ``keep`` literals finds the lines worth keeping, and once the first
half of ``MAX_RETAINED`` is full only a block's last lines that can still be among the last
half are looked at (a short ASCII line that pass hits is relevant without being decoded). A
signature already recorded ``MAX_PER_SIGNATURE`` times for a line's rank is not searched
again there. Every line is examined as before; the passes only skip lines that cannot change
the result (the prefilter matches whole lines, so a match that exists only in a line cut at
``EXAMINE_CHARS`` may be missed).

Signature ids (rules reference them as ``{signature: ID}``; ids are stable, never reused).
Named groups captured into ``Signature.data`` are listed in brackets.

NCCL
  nccl_error                   any "NCCL error in: FILE:LINE, MESSAGE" or "NCCL Error N: MESSAGE"
                               [error, nccl_version]
  nccl_unhandled_system_error  ncclSystemError / "unhandled system error": a system call
                               (socket, shm, malloc) failed inside NCCL
  nccl_unhandled_cuda_error    ncclUnhandledCudaError / "unhandled cuda error": a CUDA call
                               failed inside NCCL (version/arch mismatch, broken P2P)
  nccl_invalid_usage           ncclInvalidUsage / "invalid usage": e.g. two ranks on one GPU
  nccl_internal_error          ncclInternalError / NCCL "internal error"
  nccl_remote_error            ncclRemoteError / "remote process exited or there was a
                               network error": a peer rank died or the network failed
  nccl_warn                    any "NCCL WARN" debug line [message]
  nccl_cuda_failure            "NCCL WARN Cuda failure 'X'" [error]
  nccl_shm_error               NCCL could not create/open a /dev/shm segment [size]
  nccl_socket_error            NCCL/gloo socket failures: "Socket creation failed", "no
                               socket interface found", "No usable listening interface"
  nccl_ib_error                InfiniBand/RoCE failures: NET/IB errors, "ibv_* failed"
  nccl_ibverbs_missing         "Failed to open libibverbs.so": harmless without InfiniBand
  nccl_transport               NCCL INFO channel setup "via P2P/IPC", "via SHM", "via NET/IB"
                               [transport]
  nccl_env                     NCCL INFO "NCCL_X set by environment to V" [var, value]
  nccl_version                 "NCCL version X" banner or error suffix [version]
  nccl_async_teardown          "Some NCCL operations have failed or timed out" / "taking the
                               entire process down"
  nccl_watchdog_timeout        ProcessGroupNCCL "Watchdog caught collective operation
                               timeout" [collective, seq, timeout_ms, ran_ms]
  nccl_heartbeat_timeout       the ProcessGroupNCCL heartbeat monitor / watchdog got stuck
  nccl_not_built               "Distributed package doesn't have NCCL built in"
  nccl_comm_init_failed        "ncclCommInitRank failed"
  gloo_timeout                 gloo "Timed out waiting Nms for send/recv operation"
  collective_mismatch          "Detected mismatch between collectives on ranks"
                               [collective, shape]
Process groups, launch and rendezvous
  address_in_use               "Address already in use", EADDRINUSE, errno 98, a store that
                               failed to listen [port]
  rendezvous_timeout           the TCP store / rendezvous timed out waiting for ranks
                               [joined, expected]
  connection_refused           "Connection refused" (store, gloo, NCCL bootstrap)
  child_failed                 torchrun's ChildFailedError, and its summary's first failing
                               rank [first_failing_rank, exitcode]
  sigkill_exit                 a process killed by signal 9 (exit -9 / 137, "Signal 9",
                               OOM killer) [exitcode, local_rank]
  lightning_ddp_init           Lightning "Initializing distributed: GLOBAL_RANK: r, MEMBER:
                               m/n" [member, world_size]
  duplicate_global_rank        two "GLOBAL_RANK: r" lines with the same r in one log
                               (SLURM tasks and devices disagree) [rank]
  lightning_all_registered     Lightning "All distributed processes registered. Starting
                               with N processes" [world_size]
  lightning_cuda_visible       Lightning "LOCAL_RANK: r - CUDA_VISIBLE_DEVICES: [..]"
                               [local_rank, devices]
  interactive_incompatible     Lightning "is not compatible with an interactive environment"
  pickle_error                 spawn could not pickle: "Can't pickle", PicklingError, "Can't
                               get attribute X on <module"
  torch_extensions_root        "Using DIR as PyTorch extensions root" (DeepSpeed/JIT ops)
Devices and CUDA
  duplicate_gpu                "Duplicate GPU detected" (NCCL) or Lightning "must be unique"
                               [rank_a, rank_b, device]
  device_mismatch              "Expected all tensors to be on the same device" and its older
                               / DataParallel forms [device_a, device_b]
  ddp_multi_device_module      DDP "device_ids and output_device arguments only work with
                               single-device" (a model spread over GPUs, device_map="auto")
  quantized_wrong_device       "loaded in 8-bit/4-bit precision on a different device"
  cuda_oom                     CUDA out of memory [requested, device, total]
  cuda_fork_reinit             "Cannot re-initialize CUDA in forked subprocess"
  cuda_invalid_device_ordinal  "invalid device ordinal"
  cuda_no_kernel_image         "no kernel image is available for execution on the device"
  cuda_arch_incompatible       "GPU with CUDA capability sm_X is not compatible with the current
                               PyTorch installation" [gpu, arch]
  cuda_driver_too_old          "The NVIDIA driver on your system is too old", "driver
                               version is insufficient for CUDA runtime version"
  torch_not_compiled_with_cuda "Torch not compiled with CUDA enabled"
  no_cuda_gpus                 torch sees no CUDA device: "No CUDA GPUs are available", Lightning's
                               "But your machine only has: []", "Found no NVIDIA driver"
  cuda_error                   any other "CUDA error: X" [error]
DDP
  ddp_unused_parameters        "Expected to have finished reduction in the prior iteration",
                               parameters that did not receive grad [indices]
  ddp_param_shape_mismatch     DDP found the model differs across ranks (param count, sizes
                               or strides)
  ddp_verify_params            a frame in _verify_param_shape_across_processes /
                               _verify_params_across_processes (hangs and errors there)
Data loading and host memory
  shm_bus_error                "DataLoader worker (pid N) is killed by signal: Bus error",
                               "insufficient shared memory (shm)" [pid]
  shm_no_space                 torch shared-memory file writes failing: "unable to write to
                               file </torch_...>", "No space left on device" on /dev/shm
  dataloader_worker_died       a DataLoader worker exited unexpectedly or was killed (other
                               than a bus error)
Packages
  lightning_mixed_packages     objects from `lightning` and `pytorch_lightning` mixed
  python_exception             any "SomeError: message" exception line [type, message]
"""

from __future__ import annotations

import codecs
import functools
import io
import os
import re
import sys
from bisect import bisect_right
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import IO, Any

import re2

from probes.env import redact_text
from probes.facts import Log, LogLine, Signature
from probes.patterns import PatternSet, engine, without_captures, without_lookaround
from probes.prefilter import required_literals
from probes.signatures import Catalog, SignatureDef, shipped

SHORT_LOG_LINES = 2000
HEAD_LINES = 200
TAIL_LINES = 200
CONTEXT = 2
TRACEBACK_LINES = 80
MAX_RETAINED = 6000
MAX_PER_SIGNATURE = 20
MAX_SIGNATURES = 2000
MAX_LINE_CHARS = 64 * 1024
KEPT_LINE_CHARS = 2000
EXAMINE_CHARS = 4096  # signatures are searched in a line's first characters only
EXCERPT_CHARS = 400
BLOCK_BYTES = 2 << 20
# blocks held before their retention is settled, and the slice of a block looked at first
RING_BYTES = 24 << 20
SUFFIX_BYTES = 256 << 10


class LogError(ValueError):
    """A log that cannot be read as text; the message names the source."""


def _alternation(words: tuple[str, ...]) -> str:
    """A regex matching any of the words, as a trie: sre tries a branch's alternatives one
    by one, so sharing prefixes keeps each text position to a few cheap tests."""
    trie: dict[str, dict] = {}
    for word in words:
        node = trie
        for ch in word:
            node = node.setdefault(ch, {})
        node[""] = {}

    def build(node: dict[str, dict]) -> str:
        branches = [re.escape(ch) + build(sub) for ch, sub in sorted(node.items()) if ch]
        if not branches:
            return ""
        body = branches[0] if len(branches) == 1 else "(?:" + "|".join(branches) + ")"
        if "" in node:  # a word ends here and longer ones go on
            return "(?:" + body + ")?"
        return body

    return build(trie)


# Signatures the reader emits itself, from what several lines say together (not a pattern).
READER_SIGNATURES = {
    "duplicate_global_rank": "two ranks report the same GLOBAL_RANK (SLURM tasks and devices disagree)"
}

# Lowercase words that make a line worth keeping in a long log even without a signature.
_RELEVANT_WORDS = (
    "error", "warn", "xception", "traceback", "fatal", "killed", "timed out", "timeout", "failed",
    "failure", "abort", "segmentation fault", "core dumped", "deadlock",
)  # fmt: skip
# Lines the reader needs for its own state, signature or not.
_STATE_WORDS = ("traceback (most recent call last)", "local_rank", "root cause")

_RE2_OPTIONS = re2.Options()
_RE2_OPTIONS.log_errors = False
# the combined patterns' DFAs (RE2 gives a third of it to the reverse one that finds where a match
# starts): a budget too small for the catalog makes RE2 fall back to its NFA, some hundred times
# slower on a long log; the cap is memory RE2 may take, not memory it takes up front
_RE2_OPTIONS.max_mem = 128 << 20


class _Matcher:
    """What the reader looks for. Per line (lowercased text): every literal of the catalog's
    signatures, the relevant words, its own state words and the caller's ``keep`` literals
    (lines a rule's log pattern may match). Per block (UTF-8 bytes): ``signature_finder``,
    an RE2 pattern that flags every line where a signature or the reader's state can change,
    and ``relevant_finder``, the lines holding a relevant word or a ``keep`` literal."""

    def __init__(self, catalog: Catalog, keep: frozenset[str]):
        self.catalog = catalog
        by_literal = catalog.by_literal
        literals = set(by_literal) | set(_RELEVANT_WORDS) | set(_STATE_WORDS) | keep
        relevant = set(_RELEVANT_WORDS) | keep
        words = tuple(sorted(literals))
        # every literal starting at each position (a lookahead): overlapping literals all count
        self.each = re.compile("(?=(" + _alternation(words) + "))")
        self.relevant = re.compile(_alternation(tuple(sorted(relevant))))
        # a literal found at a position also implies each shorter literal it starts with
        self.implied: dict[str, tuple[tuple[SignatureDef, ...], bool]] = {}
        known = set(words)
        for word in words:
            prefixes = [word[:n] for n in range(1, len(word) + 1) if word[:n] in known]
            sigs = tuple({s.id: s for w in prefixes for s in by_literal.get(w, ())}.values())
            self.implied[word] = (sigs, any(w in relevant for w in prefixes))
        self.signature_finder = _signature_finder(catalog)
        # per examined line, one multi-pattern pass says which signatures' patterns match
        self.signature_set = PatternSet(p for sig in catalog.signatures.values() for p in sig.patterns)
        in_set = set(self.signature_set.patterns)
        self.by_pattern: dict[str, list[SignatureDef]] = {}
        for sig in catalog.signatures.values():
            for pattern in sig.patterns:
                self.by_pattern.setdefault(pattern, []).append(sig)
        self.outside_set = [s for s in catalog.signatures.values() if any(p not in in_set for p in s.patterns)]
        self.relevant_finder = _literal_finder(relevant)
        # on a short ASCII line without a carriage return, what the finder matched is what
        # is_relevant would find, unless a word's every non-ASCII letter case-folds to an ASCII
        # one (the long s, the Kelvin sign): RE2 would find such a word in ASCII text
        self.ascii_words = all(
            w.isascii() or any(ord(c) > 127 and c not in "\u017f\u212a" for c in w) for w in relevant
        )
        # signatures whose match can name a rank: the only ones whose count key needs the match
        self.ranked = {
            sig.id
            for sig in catalog.signatures.values()
            if any("rank" in c.groupindex for c in (*sig.compiled, *sig.compiled_fields))
        }

    def candidates(self, lowered: str) -> tuple[list[SignatureDef], bool]:
        """The signatures a line may match, in catalog order, and whether it is relevant."""
        found: dict[str, SignatureDef] = {}
        relevant = False
        for m in self.each.finditer(lowered):
            sigs, makes_relevant = self.implied[m.group(1)]
            relevant = relevant or makes_relevant
            for sig in sigs:
                found.setdefault(sig.id, sig)
        order = self.catalog.order
        return sorted(found.values(), key=lambda s: order[s.id]), relevant

    def examine(self, text: str) -> tuple[list[SignatureDef], bool, set[str]]:
        """``candidates``, narrowed to the signatures whose patterns match (one RE2 pass over the
        line for all of them); a signature with anchors still needs one of them in the line.
        Also the ids of the candidates known to match (their own search cannot fail)."""
        lowered = text.lower()
        matching = self.signature_set.matching(text.encode("utf-8", errors="surrogatepass"))
        if matching is None:
            return (*self.candidates(lowered), set())
        found = {
            sig.id: sig
            for pattern in matching
            for sig in self.by_pattern[pattern]
            if not sig.anchors or any(anchor in lowered for anchor in sig.anchors)
        }
        confirmed = set(found)
        for sig in self.outside_set:  # a pattern RE2 cannot run: its literals select it, as before
            if any(literal in lowered for literal in sig.literals):
                found.setdefault(sig.id, sig)
        order = self.catalog.order
        candidates = sorted(found.values(), key=lambda sig: order[sig.id])
        return candidates, self.relevant.search(lowered) is not None, confirmed

    def is_relevant(self, text: str) -> bool:
        """Whether a line (as examined) holds a relevant word or a ``keep`` literal."""
        return self.relevant.search(text[:EXAMINE_CHARS].lower()) is not None


def _literal_finder(words: Iterable[str]) -> Any:
    return re2.compile("(?i)" + "|".join(re2.escape(w) for w in sorted(words)), options=_RE2_OPTIONS)


def _signature_finder(catalog: Catalog) -> Any:
    """One RE2 pattern over a block that flags a superset of the lines where a signature can
    match or the reader's state changes: the signatures' own patterns, without their capturing
    groups (only where a match is matters here, and submatch tracking would cost more than the
    scan); a pattern RE2 cannot run goes in without its look-arounds (a superset of its lines),
    and one RE2 cannot run even so, or one anchored to the whole text, is found by its
    literals. The case-insensitive ones sit in a group of their own so their flag stays there."""
    plain = [_TRACEBACK.pattern, _ROOT_CAUSE.pattern, without_captures(_SUMMARY_RANK.pattern)]
    folded: list[str] = []
    for sig in catalog.signatures.values():
        for pattern in sig.patterns:
            whole_text = any(anchor in pattern for anchor in ("\\A", "\\Z", "\\z"))
            # a look-around RE2 cannot run only narrows a match: without it, the pattern flags a
            # superset of its lines (the signature's literals, common words such as "rank" or
            # "node", would flag most lines of a long NCCL log)
            relaxed = without_lookaround(pattern)
            if not whole_text and engine(relaxed) == "re2":
                (folded if "(?i)" in relaxed else plain).append(without_captures(relaxed))
            else:
                folded.extend(re2.escape(literal) for literal in required_literals(pattern) or sig.literals)
    groups = [f"(?:{p})" for p in plain]
    if folded:
        groups.append("(?i:" + "|".join(folded) + ")")
    return re2.compile("(?m)" + "|".join(groups), options=_RE2_OPTIONS)


@functools.cache
def _matcher(keep: frozenset[str] = frozenset()) -> _Matcher:
    return _Matcher(shipped(), keep)


def known_signatures() -> dict[str, str]:
    """Every signature id the reader can emit -> what it means."""
    return {**{s.id: s.description for s in shipped().signatures.values()}, **READER_SIGNATURES}


# a paste's own line numbers ("[80746] ") may stand before a launcher prefix
_RANK_PREFIX = re.compile(
    r"^\s*(?:\[\d+\]\s*)?(?:\[rank(?P<rank>\d+)\]:|\[\d+,(?:mpirank:)?(?P<mpi>\d+)(?:,[^\]]*)?\]<std(?:out|err)>:)"
)
_LOCAL_PREFIX = re.compile(r"^\s*\[[A-Za-z_]+(?P<local>\d+)\]:")
_SLURM_PREFIX = re.compile(r"^\s*(?P<rank>\d{1,5}): ")
_INLINE_RANK = re.compile(r"\[(?:rank: ?|(?:PG [^\]]*?)?Rank )(?P<rank>\d+)\]")
_SUMMARY_RANK = re.compile(r"^\s*(?:\[\w+\]:)?\s*rank\s*:\s*(?P<rank>\d+)\s*\(local_rank:\s*(?P<local>\d+)\)")
_ROOT_CAUSE = re.compile(r"Root Cause \(first observed failure\)")
_TRACEBACK = re.compile(r"Traceback \(most recent call last\)")
_STRIP_PREFIX = re.compile(r"^\s*(?:\[\d+\]\s*)?(?:\[\w+(?:: ?\d+)?\]:?|\[\d+,[^\]]*\]<std(?:out|err)>:|\d{1,5}:)\s?")
# signatures whose matches change the reader's state beyond their own count
_STATEFUL = frozenset({"lightning_ddp_init", "child_failed"})
# the banner in quotes or backticks is the reader quoting a line of the log, not a second process
_QUOTED_BANNER = re.compile(r"[\x22'`\u201c]\s*(?:initializing|Initializing) (?:ddp|distributed)")
_MAX_RANKS = 1 << 16  # distinct GLOBAL_RANK values tracked, to keep memory bounded
_SUMMARY_SPAN = 8  # lines after "rank : N" that still belong to that rank's summary entry


def _displayed(line: str) -> str:
    if "\r" not in line:
        return line
    parts = [p for p in line.split("\r") if p.strip()]
    return parts[-1] if parts else ""


class _Block:
    """One block of complete lines (UTF-8, joined by newlines, no trailing newline), with the
    lines looked at so far by index -> (start, end) byte offsets."""

    def __init__(self, data: bytes, finder: Any) -> None:
        """``finder``: the block-wide pattern whose lines ``flagged`` lists; counting the lines
        between its matches also counts the block's lines, so the bytes are counted once."""
        self.data = data
        self.spans: dict[int, tuple[int, int]] = {}
        self.count = 0
        self.flagged = self.find(finder)

    def _end(self, start: int) -> int:
        end = self.data.find(b"\n", start)
        return len(self.data) if end == -1 else end

    def add(self, index: int, start: int) -> None:
        if index not in self.spans:
            self.spans[index] = (start, self._end(start))

    def span(self, index: int) -> tuple[int, int]:
        """Offsets of a line near one already looked at (context lines are a few steps away)."""
        spans = self.spans
        if index not in spans:
            for step in range(1, CONTEXT + 2):
                if index - step in spans:  # walk forward from a known line
                    start = spans[index - step][1] + 1
                    for i in range(index - step + 1, index + 1):
                        self.add(i, start)
                        start = spans[i][1] + 1
                    break
                if index + step in spans:  # walk back from a known line
                    end = spans[index + step][0] - 1
                    for i in range(index + step - 1, index - 1, -1):
                        start = self.data.rfind(b"\n", 0, end) + 1
                        spans[i] = (start, end)
                        end = start - 1
                    break
            else:
                self._locate(index)
        return spans[index]

    def _locate(self, index: int) -> None:
        start = 0
        for _ in range(index):
            start = self.data.index(b"\n", start) + 1
        self.add(index, start)

    def text(self, index: int) -> str:
        start, end = self.span(index)
        return _displayed(self.data[start:end].decode("utf-8", errors="replace"))

    def last_lines(self, count: int) -> list[int]:
        """Indices of the block's last ``count`` lines, their offsets recorded."""
        first = max(0, self.count - count)
        end = len(self.data)
        for i in range(self.count - 1, first - 1, -1):
            start = self.data.rfind(b"\n", 0, end) + 1
            self.spans.setdefault(i, (start, end))
            end = start - 1
        return list(range(first, self.count))

    def find(self, finder: Any, start: int = 0, first_index: int = 0) -> list[int]:
        """Indices of the lines, from the line starting at byte ``start`` (index ``first_index``),
        where ``finder`` matches; each line once."""
        data = self.data
        found: list[int] = []
        index, pos = first_index, start
        search, count = finder.search, data.count
        while True:
            m = search(data, pos)
            if m is None:
                self.count = max(self.count, index + count(b"\n", pos) + 1)
                return found
            at = m.start()
            index += count(b"\n", pos, at)
            line_start = data.rfind(b"\n", 0, at) + 1
            self.add(index, line_start)
            found.append(index)
            pos = self.spans[index][1] + 1
            if pos > len(data):
                self.count = max(self.count, index + 1)
                return found
            index += 1


@dataclass
class _State:
    name: str
    lines_read: int = 0
    head: list[LogLine] = field(default_factory=list)
    first: list[tuple[int, str]] = field(default_factory=list)
    last: deque[tuple[int, str]] = field(default_factory=lambda: deque(maxlen=MAX_RETAINED // 2))
    kept_nos: set[int] = field(default_factory=set)
    tail: deque[tuple[int, str]] = field(default_factory=lambda: deque(maxlen=TAIL_LINES))
    before: deque[tuple[int, str]] = field(default_factory=lambda: deque(maxlen=CONTEXT))
    after_left: int = 0
    traceback_left: int = 0
    traceback_started: bool = False
    summary_rank: int | None = None
    summary_line: int = -(10**9)
    in_root_cause: bool = False
    signatures: list[Signature] = field(default_factory=list)
    per_key: dict[tuple[str, int | None], int] = field(default_factory=dict)
    global_ranks: dict[int, int] = field(default_factory=dict)


class _Reader:
    def __init__(self, name: str, matcher: _Matcher) -> None:
        self.s = _State(name)
        self.matcher = matcher
        self.ring: list[_Pending] = []  # blocks whose retention waits for the blocks after them
        self.ring_bytes = 0

    # --- per line ---------------------------------------------------------------------------

    def _rank(self, text: str) -> tuple[int | None, int | None]:
        """(rank, local_rank) a line's launcher prefix or inline tag names."""
        m = _RANK_PREFIX.match(text)
        if m:
            return int(m.group("rank") or m.group("mpi")), None
        m = _SLURM_PREFIX.match(text)
        if m:
            return int(m.group("rank")), None
        m = _LOCAL_PREFIX.match(text)
        local = int(m.group("local")) if m else None
        m = _INLINE_RANK.search(text)
        if m:
            return int(m.group("rank")), local
        return None, local

    def _keep(self, no: int, text: str) -> None:
        s = self.s
        if no in s.kept_nos or no <= HEAD_LINES:
            return
        line = (no, text[:KEPT_LINE_CHARS])
        if len(s.first) < MAX_RETAINED // 2:
            s.first.append(line)
        else:
            if len(s.last) == s.last.maxlen:
                s.kept_nos.discard(s.last[0][0])
            s.last.append(line)
        s.kept_nos.add(no)

    def _signature(self, sig_id: str, no: int, text: str, rank: int | None, data: dict[str, str]) -> None:
        s = self.s
        key = (sig_id, rank)
        count = s.per_key.get(key, 0)
        if count >= MAX_PER_SIGNATURE or len(s.signatures) >= MAX_SIGNATURES:
            return
        s.per_key[key] = count + 1
        s.signatures.append(
            Signature(
                id=sig_id,
                line=no,
                excerpt=redact_text(text.strip()[:EXCERPT_CHARS]),
                rank=rank,
                source=s.name,
                data={k: redact_text(v) for k, v in data.items()},
            )
        )

    def _examine(self, no: int, text: str) -> bool:
        """Find signatures on one line and update rank state; True if the line is relevant."""
        s = self.s
        candidates, relevant, confirmed = self.matcher.examine(text)
        rank, local = self._rank(text)
        summary = _SUMMARY_RANK.match(text) if "local_rank" in text else None
        if "Root Cause" in text and _ROOT_CAUSE.search(text):
            s.in_root_cause = True
        if summary:
            relevant = True
            s.summary_rank, s.summary_line = int(summary.group("rank")), no
            if s.in_root_cause:
                s.in_root_cause = False
                self._signature(
                    "child_failed",
                    no,
                    text,
                    s.summary_rank,
                    {"first_failing_rank": summary.group("rank"), "local_rank": summary.group("local")},
                )
        elif rank is None and no - s.summary_line <= _SUMMARY_SPAN:
            rank = s.summary_rank
        full = len(s.signatures) >= MAX_SIGNATURES
        for sig in candidates:
            if (
                sig.id in confirmed
                and sig.id not in self.matcher.ranked
                and sig.id not in _STATEFUL
                and (full or s.per_key.get((sig.id, rank), 0) >= MAX_PER_SIGNATURE)
            ):
                relevant = True  # it matches, and nothing more of it would be recorded
                continue
            data = sig.match(text)
            if data is None:
                continue
            relevant = True
            sig_rank = rank
            if "rank" in data:  # the line names the rank it is about
                sig_rank = int(data.pop("rank"))
            if local is not None:
                data.setdefault("local_rank", str(local))
            if (
                sig.id == "lightning_ddp_init"
                and sig_rank is not None
                and len(s.global_ranks) < _MAX_RANKS
                and not _QUOTED_BANNER.search(text)
                # processes that each form a world of one are separate jobs (or one banner pasted
                # twice), not two claims on a rank of one group
                and data.get("world_size") != "1"
            ):
                seen = s.global_ranks.get(sig_rank, 0) + 1
                s.global_ranks[sig_rank] = seen
                if seen == 2:
                    self._signature("duplicate_global_rank", no, text, sig_rank, {})
            if sig.id == "child_failed" and s.in_root_cause and "Root Cause" in text:
                continue  # recorded with its rank on the summary's "rank :" line
            self._signature(sig.id, no, text, sig_rank, data)
        return relevant

    # --- per block --------------------------------------------------------------------------

    def feed(self, data: bytes) -> None:
        """Process a block of complete lines joined by newlines (no trailing newline). Until the
        first half of the retained lines is full, a block is taken in slices and each slice's
        retention settled at once; after that blocks wait in ``ring`` (see ``_flush``)."""
        while len(self.s.first) < MAX_RETAINED // 2 and len(data) > SUFFIX_BYTES:
            cut = data.find(b"\n", SUFFIX_BYTES)
            if cut == -1:
                break
            self._feed(data[:cut])
            self._flush()
            data = data[cut + 1 :]
        self._feed(data)
        if len(self.s.first) < MAX_RETAINED // 2 or self.ring_bytes >= RING_BYTES:
            self._flush()

    def _feed(self, data: bytes) -> None:
        s = self.s
        block = _Block(data, self.matcher.signature_finder)
        base, n = s.lines_read, block.count
        if base < SHORT_LOG_LINES:
            start = 0
            for i in range(min(n, SHORT_LOG_LINES - base)):
                block.add(i, start)
                text = block.text(i)
                rank, _ = self._rank(text)
                s.head.append(
                    LogLine(no=base + i + 1, text=redact_text(text[:KEPT_LINE_CHARS]), rank=rank, source=s.name)
                )
                start = block.spans[i][1] + 1
        relevant, traceback = self._signatures(block, base)
        self.ring.append(_Pending(block, base, {base + i + 1 for i in relevant}, {base + i + 1 for i in traceback}))
        self.ring_bytes += len(data)
        for j in block.last_lines(TAIL_LINES):
            s.tail.append((base + j + 1, block.text(j)))
        s.lines_read = base + n

    def _signatures(self, block: _Block, base: int) -> tuple[set[int], set[int]]:
        """Examine the lines where a signature or the reader's state can change, in order, and
        follow tracebacks; returns the indices of the relevant lines and of traceback lines."""
        s = self.s
        flagged = sorted({*block.flagged, *_carriage_lines(block)})
        relevant: set[int] = set()
        traceback: set[int] = set()
        i = 0
        for idx in flagged:
            while s.traceback_left > 0 and i < idx:
                self._follow(block.text(i), traceback, i)
                i += 1
            text = block.text(idx)
            if s.traceback_left > 0:
                self._follow(text, traceback, idx)
            if self._examine(base + idx + 1, text[:EXAMINE_CHARS]):
                relevant.add(idx)
            if _TRACEBACK.search(text):
                s.traceback_left, s.traceback_started = TRACEBACK_LINES, False
                traceback.add(idx)
            i = idx + 1
        while s.traceback_left > 0 and i < block.count:
            if i not in block.spans:
                block.add(i, block.spans[i - 1][1] + 1 if i else 0)
            self._follow(block.text(i), traceback, i)
            i += 1
        return relevant, traceback

    def _follow(self, text: str, traceback: set[int], index: int) -> None:
        """One line inside a traceback: kept; the exception line closes it."""
        s = self.s
        traceback.add(index)
        body = _STRIP_PREFIX.sub("", text, count=1)
        s.traceback_left -= 1
        if body[:1] in (" ", "\t") or body.startswith("Traceback"):
            s.traceback_started = True
        elif s.traceback_started and body.strip():
            s.traceback_left = 0

    def _flush(self) -> None:
        """Settle which lines of the waiting blocks are kept: each relevant line with CONTEXT
        lines either side, and the tracebacks. Once the first half of the retained lines is
        full only the last ``MAX_RETAINED // 2`` kept lines matter, so relevant lines are
        looked for from the newest block back, only as far as that many kept lines reach: in
        a log where most lines are relevant, most lines are never looked at."""
        s, ring = self.s, self.ring
        if not ring:
            return
        self.ring, self.ring_bytes = [], 0
        low, high = ring[0].base + 1, ring[-1].base + ring[-1].block.count  # line numbers
        need = MAX_RETAINED // 2 if len(s.first) >= MAX_RETAINED // 2 else None
        relevant: set[int] = set()
        traceback: set[int] = set()
        for p in ring:
            relevant |= p.relevant
            traceback |= p.traceback
        scanned = high + 1  # relevant lines are all known from this line number on
        for p in reversed(ring):
            size = SUFFIX_BYTES if need else len(p.block.data)
            while scanned > p.base + 1:
                start = max(0, len(p.block.data) - size)
                start = p.block.data.find(b"\n", start - 1) + 1 if start else 0
                index = p.block.data.count(b"\n", 0, start)
                relevant.update(p.base + i + 1 for i in self._relevant_from(p.block, start, index))
                scanned = p.base + index + 1
                if need and _count_kept(relevant, traceback, scanned + CONTEXT, high) >= need:
                    break
                size *= 2
            if need and _count_kept(relevant, traceback, scanned + CONTEXT, high) >= need:
                break
        exact = scanned + CONTEXT if scanned > low else low  # context from unread lines stops here
        kept = _kept(relevant, traceback, exact, high)
        kept.update(range(low, min(high, low + s.after_left - 1) + 1))  # owed by the lines before
        if exact == low:
            for r in sorted(r for r in relevant if r < low + CONTEXT):  # context in the lines before
                for no, text in s.before:
                    if no >= r - CONTEXT:
                        self._keep(no, text)
        text = _LineTexts(ring)
        for no in sorted(no for no in kept if no >= exact):
            self._keep(no, text(no))
        last = max((r for r in relevant if r > high - CONTEXT), default=None)
        s.after_left = max(0, last + CONTEXT - high) if last is not None else max(0, s.after_left - (high - low + 1))
        s.before.extend((no, text(no)) for no in range(max(low, high - CONTEXT + 1), high + 1))

    def _relevant_from(self, block: _Block, start: int, first_index: int) -> list[int]:
        """Indices of the lines, from byte ``start``, that hold a relevant word or keep literal."""
        matcher, data, spans = self.matcher, block.data, block.spans
        found = []
        for i in block.find(matcher.relevant_finder, start, first_index):
            begin, end = spans[i]
            if (
                matcher.ascii_words
                and end - begin <= EXAMINE_CHARS
                and data.find(b"\r", begin, end) == -1
                and data[begin:end].isascii()
            ):
                found.append(i)
            elif matcher.is_relevant(block.text(i)):
                found.append(i)
        return found

    def finish(self) -> Log:
        self._flush()
        s = self.s
        if s.lines_read <= SHORT_LOG_LINES:
            lines = s.head
        else:
            by_no = {line.no: line for line in s.head[:HEAD_LINES]}
            for no, text in [*s.first, *s.last, *s.tail]:
                if no not in by_no:
                    rank = self._rank(text)[0]
                    by_no[no] = LogLine(no=no, text=redact_text(text[:KEPT_LINE_CHARS]), rank=rank, source=s.name)
            lines = [by_no[no] for no in sorted(by_no)]
        return Log(source="log", sources=[s.name], lines_read=s.lines_read, lines=lines, signatures=s.signatures)


@dataclass
class _Pending:
    """A block read and examined whose retention is not settled yet (line numbers, 1-based)."""

    block: _Block
    base: int
    relevant: set[int]
    traceback: set[int]


def _kept(relevant: set[int], traceback: set[int], low: int, high: int) -> set[int]:
    """Line numbers in [low, high] kept: each relevant line with CONTEXT lines either side, and
    the traceback lines."""
    kept = {no for no in traceback if low <= no <= high}
    for r in relevant:
        if r + CONTEXT >= low and r - CONTEXT <= high:
            kept.update(range(max(low, r - CONTEXT), min(high, r + CONTEXT) + 1))
    return kept


def _count_kept(relevant: set[int], traceback: set[int], low: int, high: int) -> int:
    return len(_kept(relevant, traceback, low, high))


class _LineTexts:
    """The displayed text of a line of the waiting blocks, by its number."""

    def __init__(self, ring: list[_Pending]) -> None:
        self.ring = ring
        self.bases = [p.base for p in ring]

    def __call__(self, no: int) -> str:
        p = self.ring[bisect_right(self.bases, no - 1) - 1]
        return p.block.text(no - p.base - 1)


def _carriage_lines(block: _Block) -> set[int]:
    """Lines holding a carriage return: what they display is their last segment, which the
    block-wide patterns (anchored at line starts and ends) do not see, so each is examined."""
    data = block.data
    found: set[int] = set()
    at = data.find(b"\r")
    index, pos = 0, 0
    while at != -1:
        index += data.count(b"\n", pos, at)
        block.add(index, data.rfind(b"\n", 0, at) + 1)
        found.add(index)
        pos = block.spans[index][1] + 1
        index += 1
        at = data.find(b"\r", pos)
    return found


# --- input ------------------------------------------------------------------------------------

_BINARY_SAMPLE = 64 * 1024
_BINARY_SHARE = 0.05
_BINARY_MIN = 256
_VALIDATE_BYTES = 256 << 10
# C0 controls other than whitespace and ESC (ANSI colours). Replacement characters do not
# count: they mean another encoding (GBK, latin-1), whose ASCII parts still read fine.
_CONTROL = re.compile(r"[\x00-\x08\x0e-\x1a\x1c-\x1f]")


def _read_chunks(f: IO[Any]) -> Iterator[str | bytes]:
    while True:
        chunk = f.read(BLOCK_BYTES)
        if not chunk:
            return
        yield chunk


def _iter_items(items: Iterable[Any]) -> Iterator[str | bytes]:
    """Lines from an iterable, batched into blocks; an item without a newline is one line."""
    batch: list[str] = []
    size = 0
    for item in items:
        if isinstance(item, (bytes, bytearray)):
            item = bytes(item).decode("utf-8", errors="replace")
        elif not isinstance(item, str):
            item = str(item)
        if not item.endswith("\n"):
            item += "\n"
        batch.append(item)
        size += len(item)
        if size >= BLOCK_BYTES:
            yield "".join(batch)
            batch, size = [], 0
    if batch:
        yield "".join(batch)


def _utf8(pieces: Iterator[str | bytes]) -> Iterator[bytes]:
    """UTF-8 bytes of any pieces: text encoded; bytes as they are, unless a byte-order mark
    names UTF-16 (re-encoded) or UTF-8 (dropped)."""
    first = next(pieces, None)
    while first is not None and not first:
        first = next(pieces, None)
    if first is None:
        return
    if isinstance(first, str):
        yield first.encode("utf-8", errors="surrogatepass")
        for piece in pieces:
            yield piece.encode("utf-8", errors="surrogatepass") if isinstance(piece, str) else bytes(piece)
        return
    if first.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        decoder = codecs.getincrementaldecoder("utf-16")(errors="replace")
        yield decoder.decode(first).encode("utf-8", errors="surrogatepass")
        for piece in pieces:
            yield decoder.decode(piece).encode("utf-8", errors="surrogatepass")
        yield decoder.decode(b"", final=True).encode("utf-8", errors="surrogatepass")
        return
    yield first[len(codecs.BOM_UTF8) :] if first.startswith(codecs.BOM_UTF8) else first
    for piece in pieces:
        yield piece if isinstance(piece, bytes) else str(piece).encode("utf-8", errors="replace")


def _pieces(source: Any, name: str) -> Iterator[bytes]:
    """UTF-8 pieces of any supported source, in order."""
    if isinstance(source, (str, os.PathLike)):
        if str(source) == "-":
            yield from _pieces(sys.stdin.buffer, name)
            return
        try:
            with open(source, "rb") as f:
                yield from _utf8(_read_chunks(f))
        except OSError as exc:
            raise LogError(f"{name}: cannot read: {exc.strerror or exc}") from None
        return
    if hasattr(source, "read"):
        yield from _utf8(_read_chunks(source))
    elif isinstance(source, Iterable):
        yield from _utf8(_iter_items(source))
    else:
        raise LogError(f"{name}: not a log: a {type(source).__name__}")


def _check_text(sample: str, name: str) -> None:
    if len(sample) < _BINARY_MIN:
        return  # too little to judge; a few odd bytes read as text harm nothing
    bad = len(_CONTROL.findall(sample))
    if bad > _BINARY_SHARE * len(sample):
        raise LogError(f"{name}: not a text log ({bad} of its first {len(sample)} characters are binary)")


def _checked(pieces: Iterator[bytes], name: str) -> Iterator[bytes]:
    """The pieces, once their start has been found to be text rather than binary."""
    sample: list[bytes] = []
    got = 0
    for piece in pieces:
        sample.append(piece)
        got += len(piece)
        if got >= 4 * _BINARY_SAMPLE:  # enough bytes for the first _BINARY_SAMPLE characters
            break
    head = b"".join(sample)
    _check_text(head.decode("utf-8", errors="replace")[:_BINARY_SAMPLE], name)
    if head:
        yield head
    yield from pieces


def _valid(data: bytes) -> bytes:
    """The block as valid UTF-8 (invalid bytes as replacement characters): RE2 reads UTF-8, and
    its classes would not match an invalid byte that the decoded line shows as U+FFFD."""
    if data.isascii():
        return data
    start = 0
    while start < len(data):  # in slices ending at a newline: a decoded copy of a slice at a time
        end = data.find(b"\n", start + _VALIDATE_BYTES)
        end = len(data) if end == -1 else end
        try:
            data[start:end].decode("utf-8")
        except UnicodeDecodeError:
            return data.decode("utf-8", errors="replace").encode("utf-8", errors="surrogatepass")
        start = end
    return data


def _cut(data: bytes) -> int:
    """Where to cut a line too long to keep whole: MAX_LINE_CHARS bytes, back to a character start."""
    at = MAX_LINE_CHARS
    while at > 0 and data[at] & 0xC0 == 0x80:
        at -= 1
    return at or MAX_LINE_CHARS


def _blocks(pieces: Iterator[bytes], name: str) -> Iterator[bytes]:
    """Blocks of complete lines joined by newlines; a line longer than MAX_LINE_CHARS is cut."""
    pending = b""
    for piece in _checked(pieces, name):
        data = pending + piece if pending else piece
        cut = data.rfind(b"\n")
        if cut == -1:
            pending = data
        else:
            yield _valid(data[:cut])
            pending = data[cut + 1 :]
        while len(pending) > MAX_LINE_CHARS:
            at = _cut(pending)
            yield _valid(pending[:at])
            pending = pending[at:]
    if pending:
        yield _valid(pending)


def read_log(source: Any, name: str = "log", keep: Iterable[str] = ()) -> Log:
    """Read a log from a path (``-`` is stdin), a file object (text or binary) or an
    iterable of lines; never raises on content, only ``LogError`` for unreadable or
    binary input. ``keep``: lowercase literals whose lines a long log retains too (the
    literals of the rules' log patterns, so a rule fires the same on a short and a long log)."""
    reader = _Reader(name, _matcher(frozenset(k.lower() for k in keep)))
    for block in _blocks(_pieces(source, name), name):
        reader.feed(block)
    return reader.finish()


def log_from_text(text: str, name: str = "log", keep: Iterable[str] = ()) -> Log:
    return read_log(io.StringIO(text), name, keep)
