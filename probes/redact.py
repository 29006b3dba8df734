"""One redactor for every string that leaves the tool.

A diagnosis is pasted into public issues, so whatever it quotes (environment values, log
excerpts, a job's command line, rendered fixes, saved snapshots) passes through here first.
It knows credentials by their place (URL user-info, authorization headers, ``key=value`` and
``key: value`` pairs, ``--password X`` flags, ``sshpass -p``, ``wandb login``), by their shape
(Hugging Face, W&B, GitHub, OpenAI, AWS, GCP, JWT, Slack... tokens, long mixed-case runs) and
private-key blocks whole, across lines.

Every pattern has bounded repetitions and a fixed anchor, so a hostile line costs linear time
in Python's ``re`` (no pattern here can backtrack over more than a few hundred characters).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

REDACTED = "<redacted>"

# Names of variables and keys whose value is a credential whatever it looks like.
SECRET_NAME = re.compile(r"TOKEN|SECRET|KEY|PASSWORD|PASSWD|AUTH|CREDENTIAL", re.IGNORECASE)
_ENV_NAME = re.compile(r"[A-Z][A-Z0-9_]{0,127}")

# The word a credential's key ends with: db_password, HF_TOKEN, wandb-api-key, "apiKey".
_KEYWORD = (
    r"(?:password|passwd|passphrase|secret|token|signature|credentials?|"
    r"api[_-]?key|apikey|access[_-]?key|secret[_-]?key|private[_-]?key|[a-z0-9]{1,20}[_-]key)"
)
_VALUE = r"(?:\"[^\"\n]{0,512}\"|'[^'\n]{0,512}'|[^\s\"',;&}\])]{1,512})"
# key=value, key: value, "key": "value", 'key': 'value' (a printed hparams dict), ?token=...
# Any name followed by a separator matches (from the start of the name only, so the search
# stays linear); _pair keeps the value unless the name ends with a credential word.
_PAIR = re.compile(
    rf"(?<![A-Za-z0-9_.-])(?P<key>[A-Za-z0-9_.-]{{1,64}})"
    rf"(?P<sep>[\"']?[ \t]{{0,3}}[:=][ \t]{{0,3}})(?!//)(?P<value>{_VALUE})",
)
# --password X, --wandb-key X, -token X (the '=' form is a pair above)
_FLAG = re.compile(r"(?<!\S)(?P<key>--?[A-Za-z0-9_-]{1,64})(?P<sep>[ \t]{1,8})(?!-)(?P<value>\S{1,512})")
_SECRET_KEY = re.compile(rf"{_KEYWORD}\Z", re.IGNORECASE)
# Authorization: Bearer X, Proxy-Authorization: Basic X, Cookie: a=b; the rest of the line is the secret
_HEADER = re.compile(
    r"(?<![A-Za-z0-9-])(?P<key>(?:proxy-)?authorization|x-api-key|x-auth-token|api-key|set-cookie|cookie)"
    r"(?P<sep>[\"']?[ \t]{0,3}[:=][ \t]{0,3})(?P<value>[^\n]{1,1024})",
    re.IGNORECASE,
)
_SCHEME = re.compile(r"\b(?P<key>bearer|basic)(?P<sep>[ \t]{1,4})(?P<value>[A-Za-z0-9._~+/=-]{8,1024})", re.IGNORECASE)
_USERINFO = re.compile(r"(?<=://)[^\s/@:?#]{0,256}:[^\s@]{1,256}@")
_COMMANDS = re.compile(
    r"\b(?:sshpass(?P<sep1>[ \t]{1,4}-p[ \t]{0,4})(?P<v1>\S{1,512})"
    r"|(?i:wandb)\b[^\n]{0,200}?\b(?P<v2>[0-9a-f]{40})\b)",  # wandb login KEY, WANDB...=KEY
)
_SHAPES = re.compile(
    r"""
      \bhf_[A-Za-z0-9]{20,256}                         # Hugging Face
    | \b(?:AKIA|ASIA)[0-9A-Z]{16}\b                    # AWS access key id
    | \bgh[pousr]_[A-Za-z0-9]{30,256}                  # GitHub
    | \bgithub_pat_[A-Za-z0-9_]{22,256}                # GitHub fine-grained
    | \bglpat-[A-Za-z0-9_-]{20,256}                    # GitLab
    | \bsk-[A-Za-z0-9_-]{20,256}                       # OpenAI, Anthropic (sk-ant-)
    | \b[sr]k_(?:live|test)_[A-Za-z0-9]{16,256}        # Stripe
    | \bxox[abposr]-[A-Za-z0-9-]{10,256}               # Slack
    | \bya29\.[A-Za-z0-9_-]{20,2048}                   # GCP OAuth access token
    | \bAIza[0-9A-Za-z_-]{35}                          # GCP API key
    | \bnpm_[A-Za-z0-9]{36}\b                          # npm
    | \bpypi-[A-Za-z0-9_-]{50,512}                     # PyPI
    | \beyJ[A-Za-z0-9_-]{8,2048}\.[A-Za-z0-9_-]{8,2048}(?:\.[A-Za-z0-9_-]{0,2048})?   # JWT
    """,
    re.VERBOSE,
)
# A long unbroken run of key-like characters: how random secrets look when nothing else
# gives them away. The look-behind keeps the search linear: a run is tried from its start only.
_OPAQUE = re.compile(r"(?<![\w/.+-])[A-Za-z0-9+/_-]{32,4096}={0,2}(?![\w/.=-])")
_HEX40 = re.compile(r"(?<![0-9A-Fa-f])[0-9a-f]{40}(?![0-9A-Fa-f])")
# A UUID as NVML and nvidia-smi name a GPU or MIG slice (GPU-8a6d3f0c-...): an identifier
# that a snapshot must keep to tell two ranks' devices apart, not a key.
_UUID = re.compile(r"(?:GPU-|MIG-)?[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
# Token names of tokenizers, printed with every hparams dump: ids, not credentials.
_TOKENIZER_KEYS = re.compile(r"(?:pad|eos|bos|unk|sep|cls|mask)_token", re.IGNORECASE)

_KEY_BEGIN = re.compile(r"-----BEGIN [A-Z0-9 ]{0,40}PRIVATE KEY( BLOCK)?-----")
_KEY_END = re.compile(r"-----END [A-Z0-9 ]{0,40}PRIVATE KEY( BLOCK)?-----")
# inside a key block: base64 lines, possibly behind a log prefix such as "[rank0]: "
_KEY_BODY = re.compile(
    r"(?:\[[^\]\n]{0,40}\]:?\s?)?[A-Za-z0-9+/=\s]{0,4096}|(?:Proc-Type|DEK-Info|Comment):[^\n]{0,256}"
)

# What a terminal would act on: CSI and OSC sequences whole, then any other C0/C1 control.
_ESCAPES = re.compile(r"\x1b\[[0-9;?<>=]{0,64}[ -/]{0,8}[@-~]|\x1b\][^\x07\x1b\n]{0,4096}(?:\x07|\x1b\\)?|\x1b[@-_]")
_CONTROLS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def _mixed(token: str) -> bool:
    # 32 hex digits or a long all-lowercase word are ids and names, not keys; a key mixes
    # letters of both cases with digits.
    return any(c.isdigit() for c in token) and any(c.islower() for c in token) and any(c.isupper() for c in token)


def _pair(match: re.Match[str]) -> str:
    if _secret_key(match.group("key")):
        return _hide(match)
    # NCCL_DEBUG_SUBSYS="INIT password=X": look inside the value once (only once, so that
    # a=b=c=... costs linear time)
    value = match.group("value")
    inner = _PAIR.sub(_inner_pair, value[1:]) if value[:1] in "\"'" else _PAIR.sub(_inner_pair, value)
    return match.group()[: match.start("value") - match.start()] + (value[:1] + inner if value[:1] in "\"'" else inner)


def _inner_pair(match: re.Match[str]) -> str:
    return _hide(match) if _secret_key(match.group("key")) else match.group()


def _hide(match: re.Match[str]) -> str:
    """key, separator and quotes kept; the value replaced."""
    key, value = match.group("key"), match.group("value")
    if value in (REDACTED, f'"{REDACTED}"', f"'{REDACTED}'"):
        return match.group()
    quote = value[0] if value[:1] in "\"'" and len(value) > 1 and value[-1] == value[0] else ""
    return f"{key}{match.group('sep')}{quote}{REDACTED}{quote}"


def _secret_key(key: str) -> bool:
    """The name ends with a credential word: db_password, HF_TOKEN, --wandb-key, apiKey."""
    bare = key.lstrip("-")
    if _TOKENIZER_KEYS.fullmatch(bare):
        return False
    return _SECRET_KEY.search(bare) is not None


def _command(match: re.Match[str]) -> str:
    name = "v1" if match.group("v1") is not None else "v2"
    start, end = match.span(name)
    base = match.start()
    text = match.group()
    return text[: start - base] + REDACTED + text[end - base :]


def _opaque(match: re.Match[str]) -> str:
    token = match.group()
    # an absolute path mixes cases and digits too, and is no key
    return REDACTED if _mixed(token) and not token.startswith("/") and not _UUID.fullmatch(token) else token


def redact_line(line: str) -> str:
    """One line of free text with every credential replaced by ``REDACTED``."""
    if not line:
        return line
    line = _USERINFO.sub(REDACTED + "@", line)
    line = _HEADER.sub(_hide, line)
    line = _SCHEME.sub(_hide, line)
    line = _COMMANDS.sub(_command, line)
    line = _FLAG.sub(_pair, line)
    line = _PAIR.sub(_pair, line)
    line = _SHAPES.sub(REDACTED, line)
    return _OPAQUE.sub(_opaque, line)


class Redactor:
    """Redacts a stream of strings in order, remembering an open private-key block.

    A key's base64 body has no shape of its own (its short last line least of all), so
    every line from ``-----BEGIN ... PRIVATE KEY-----`` to its END line goes, even when
    the lines arrive as separate strings (log lines, excerpts). In structured data the
    block is followed per field name, so a log line's ``text`` continues the previous
    line's ``text`` whatever other fields sit between them.
    """

    def __init__(self) -> None:
        self.in_key: set[str] = set()

    def text(self, text: str, field: str = "") -> str:
        if "\n" not in text:
            return self._line(text, field)
        return "\n".join(self._line(line, field) for line in text.split("\n"))

    def _line(self, line: str, field: str) -> str:
        if field in self.in_key:
            end = _KEY_END.search(line)
            if end:
                self.in_key.discard(field)
                return end.group()
            # a body line, or one an earlier pass already redacted (text goes through twice:
            # when read, and again when it leaves)
            if _KEY_BODY.fullmatch(line) or line.endswith(REDACTED):
                return REDACTED if line.strip() else line
            self.in_key.discard(field)  # the block was cut short: the rest is ordinary text
        begin = _KEY_BEGIN.search(line)
        if begin:
            # the BEGIN marker stays, so that a second pass still knows a block follows
            if not _KEY_END.search(line, begin.end()):
                self.in_key.add(field)
            rest = REDACTED if line[begin.end() :].strip() else ""
            return redact_line(line[: begin.start()]) + begin.group() + rest
        return redact_line(line)

    def value(self, name: str, value: str) -> str:
        """An environment variable: a credential by its name, or by anything in its value."""
        if SECRET_NAME.search(name) or _HEX40.search(value) or redact_line(value) != value:
            return REDACTED
        return value

    def scrub(self, data: Any, *, controls: bool = False, field: str = "") -> Any:
        """JSON-like data (dicts, lists, strings) with every string redacted, in document order."""
        if isinstance(data, str):
            out = self.text(data, field)
            return strip_controls(out) if controls else out
        if isinstance(data, dict):
            result = {}
            for key, value in data.items():
                shown = strip_controls(key) if controls and isinstance(key, str) else key
                if isinstance(key, str) and isinstance(value, str) and _ENV_NAME.fullmatch(key):
                    value = self.value(key, value)
                result[shown] = self.scrub(value, controls=controls, field=str(key))
            return result
        if isinstance(data, (list, tuple)):
            return [self.scrub(item, controls=controls, field=field) for item in data]
        return data


def redact(text: str) -> str:
    """Free text (a log, a command line, a value) with every credential replaced."""
    return Redactor().text(text)


def redact_lines(lines: Iterable[str]) -> list[str]:
    """Consecutive lines of one text, a private-key block spanning them redacted whole."""
    redactor = Redactor()
    return [redactor.text(line) for line in lines]


def redact_value(name: str, value: str) -> str:
    return Redactor().value(name, value)


def scrub(data: Any, *, controls: bool = False) -> Any:
    return Redactor().scrub(data, controls=controls)


def strip_controls(text: str) -> str:
    """Text a terminal shows as it is: escape sequences and control characters removed
    (newline and tab kept), so an untrusted log cannot retitle, clear or copy from it."""
    if not _CONTROLS.search(text):
        return text
    return _CONTROLS.sub("", _ESCAPES.sub("", text))
