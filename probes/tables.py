"""Knowledge tables (``kb/tables/*.yaml``): versions and hardware as data, validated and cited.

GPU model -> compute capability, class and P2P support; compute capability -> architecture and
the oldest CUDA, torch and NCCL that run on it; CUDA release -> minimum driver (Linux,
Windows); torch release -> the CUDA variants it shipped and the cuDNN and NCCL it bundles; NCCL
releases with known defects; Lightning, accelerate, transformers and DeepSpeed releases -> the
torch they need. Each file names its sources. The derived facts of ``probes.facts`` read these
tables, so rules test ``gpus.arch`` or ``torch.supports_gpu_arch`` and a GPU released next year
is a table row, not a new pattern.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Any, Literal

import yaml
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from probes.signatures import SHIPPED_YAML_LOADER, kb_dir


class TableError(ValueError):
    """A table that does not load: the message names the file and the place."""


def version(text: str | None) -> Version | None:
    """A release as packaging reads it, without a local label (``2.5.1+cu124`` -> 2.5.1)."""
    return _version(str(text)) if text else None


@functools.lru_cache(maxsize=4096)
def _version(text: str) -> Version | None:
    """Parsed once: the derived facts ask again for the same few releases on every snapshot."""
    try:
        return Version(text.split("+")[0].strip())
    except InvalidVersion:
        return None


def release(text: str | None, parts: int = 2) -> Version | None:
    """The first ``parts`` components of a release: ``12.4.1`` -> 12.4, for per-minor tables."""
    v = version(text)
    return None if v is None else Version(".".join(str(p) for p in (v.release + (0,) * parts)[:parts]))


def _check_version(value: str | None) -> str | None:
    if value is not None and version(value) is None:
        raise ValueError(f"not a version: {value!r}")
    return value


class _Row(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Capability(_Row):
    capability: str
    arch: str = Field(pattern=r"^[a-z]+$")
    min_cuda: str
    last_cuda: str | None = None
    torch_last_cuda: str | None = None
    min_torch: str | None = None
    min_nccl: str | None = None

    check_versions = field_validator("capability", "min_cuda", "last_cuda", "torch_last_cuda", "min_torch", "min_nccl")(
        _check_version
    )


class GpuModel(_Row):
    name: str = Field(min_length=2)
    capability: str
    cls: Literal["consumer", "workstation", "datacenter"] = Field(alias="class")
    p2p: Literal["supported", "unreliable", "unsupported"]
    # cloud instance types that carry this model, a size written "*": "p3.*" (AWS p3.2xlarge,
    # ml.p3.8xlarge), "a2-highgpu-*" (GCP a2-highgpu-8g)
    instances: list[str] = Field(default_factory=list)

    @field_validator("instances")
    @classmethod
    def _instance_forms(cls, values: list[str]) -> list[str]:
        bad = [v for v in values if not re.fullmatch(r"[a-z0-9]+(?:-[a-z0-9]+)*[.-]\*", v)]
        if bad:
            raise ValueError(f"an instance type is a family and a size written '*' (got {bad[0]!r})")
        return values

    @functools.cached_property
    def pattern(self) -> re.Pattern[str]:
        # a whole word or phrase, so "L4" is not found inside "L40" nor "A10" inside "A100"; people
        # write GeForce cards by number alone ("4x 4090"), so the brand words are optional there
        # and the Ampere workstation cards by their letter and number ("4x A6000" for RTX A6000)
        brand = re.match(r"GeForce (?:(RTX|GTX) )?", self.name)
        workstation = re.match(r"RTX (?=A\d{4}\b)", self.name)
        body = re.escape(self.name[brand.end() :] if brand else self.name)
        # "2080ti", "1080-Ti": the Ti suffix is written joined as often as apart
        body = body.replace(r"\ Ti", r"[\ -]?Ti")
        if brand:
            body = "(?:GeForce )?" + (f"(?:{brand.group(1)} )?" if brand.group(1) else "") + body
        elif workstation:
            body = "(?:RTX )?" + re.escape(self.name[workstation.end() :])
        # an AWS size is "8xlarge", "xlarge" or "metal"; a GCP size is a GPU count ("8g") or vCPUs
        sizes = {".": r"\.(?:\d*x?large|metal)", "-": r"-\d+g?"}
        instances = [re.escape(i[:-2]) + sizes[i[-2]] for i in self.instances]
        body = "|".join([f"(?:{body})", *(f"(?:ml\\.)?{i}" for i in instances)])
        # a plural is the model too ("8x H100s", "our 3090s")
        return re.compile(r"(?<![A-Za-z0-9])(?:" + body + r")(?:'?s)?(?![A-Za-z0-9])", re.IGNORECASE)


class DriverFloor(_Row):
    linux: str
    windows: str
    check_versions = field_validator("linux", "windows")(_check_version)


class CudaRelease(DriverFloor):
    cuda: str
    check_cuda = field_validator("cuda")(_check_version)


class MinorCompat(DriverFloor):
    major: int


class TorchRelease(_Row):
    torch: str
    cuda: list[str] = Field(min_length=1)
    cudnn: str
    nccl: str

    @field_validator("torch", "cudnn", "nccl")
    @classmethod
    def _one(cls, value: str) -> str:
        return _check_version(value) or value

    @field_validator("cuda")
    @classmethod
    def _many(cls, values: list[str]) -> list[str]:
        for value in values:
            _check_version(value)
        return values


def _check_specifier(value: str) -> str:
    try:
        SpecifierSet(value)
    except InvalidSpecifier:
        raise ValueError(f"not a version specifier: {value!r}") from None
    return value


class NcclIssue(_Row):
    versions: str
    archs: list[str] = Field(default_factory=list)  # only on these architectures; empty: on any
    issue: str
    fixed_in: str
    workaround: str
    reference: str = Field(pattern=r"^https://")
    check_spec = field_validator("versions")(_check_specifier)
    check_fixed = field_validator("fixed_in")(_check_version)


class Requirement(_Row):
    since: str
    torch: str
    check_since = field_validator("since")(_check_version)
    check_spec = field_validator("torch")(_check_specifier)


class _File(_Row):
    sources: list[str] = Field(min_length=1)

    @field_validator("sources")
    @classmethod
    def _urls(cls, values: list[str]) -> list[str]:
        bad = [v for v in values if not v.startswith("https://")]
        if bad:
            raise ValueError(f"a source is a https:// address (got {bad[0]!r})")
        return values


class GpusFile(_File):
    capabilities: list[Capability] = Field(min_length=1)
    models: list[GpuModel] = Field(min_length=1)


class CudaFile(_File):
    releases: list[CudaRelease] = Field(min_length=1)
    minor_version_compatibility: list[MinorCompat]


class TorchFeature(_Row):
    feature: str = Field(pattern=r"^[a-z_]+$")
    since: str
    module: str
    check_since = field_validator("since")(_check_version)


class TorchFile(_File):
    releases: list[TorchRelease] = Field(min_length=1)
    features: list[TorchFeature] = Field(default_factory=list)


class NcclFile(_File):
    known_issues: list[NcclIssue]


class PackagesFile(_File):
    requirements: dict[str, list[Requirement]]


_FILES: dict[str, type[_File]] = {
    "gpus": GpusFile, "cuda": CudaFile, "torch": TorchFile, "nccl": NcclFile, "packages": PackagesFile,
}  # fmt: skip


def _remembered(method: Any) -> Any:
    """A look-up answered once per distinct arguments: the tables never change, and the derived
    facts ask the same few questions (a torch release, a GPU name) for every rule and snapshot.
    Answers are immutable (rows, tuples, versions), so sharing them is safe."""

    @functools.wraps(method)
    def remembered(self: Tables, *args: Any, **kwargs: Any) -> Any:
        key = (method.__name__, args, tuple(sorted(kwargs.items())))
        memo = self._memo
        if key not in memo:
            if len(memo) >= 8192:  # a long-lived process reads many logs; one diagnosis fits
                memo.clear()
            memo[key] = method(self, *args, **kwargs)
        return memo[key]

    return remembered


class Tables:
    """The loaded tables, with the look-ups the derived facts use."""

    def __init__(self, files: dict[str, Any]):
        self.gpus: GpusFile = files["gpus"]
        self.cuda: CudaFile = files["cuda"]
        self.torch: TorchFile = files["torch"]
        self.nccl: NcclFile = files["nccl"]
        self.packages: PackagesFile = files["packages"]
        self._capabilities = {Version(c.capability): c for c in self.gpus.capabilities}
        self._memo: dict[tuple[Any, ...], Any] = {}

    @property
    def sources(self) -> dict[str, list[str]]:
        return {name: getattr(self, name).sources for name in _FILES}

    @_remembered
    def gpu_model(self, name: str | None) -> GpuModel | None:
        """The row whose name appears in ``name``; the longest such name wins."""
        if not name:
            return None
        found = [m for m in self.gpus.models if m.pattern.search(name)]
        return max(found, key=lambda m: len(m.name)) if found else None

    @_remembered
    def models_in(self, text: str) -> tuple[str, ...]:
        """The models a line of text names, each mention read as the longest row it matches
        ("RTX 5070 Ti" is not also an "RTX 5070")."""
        found = [m.name for m in self.gpus.models if m.pattern.search(text)]
        return tuple(n for n in found if not any(n != o and n in o for o in found))

    @_remembered
    def gpu_rows(self, named: tuple[tuple[str | None, str | None], ...]) -> tuple[tuple[Any, Any], ...]:
        """The (model row, capability row) of each (name, compute capability) of some GPUs."""
        rows = []
        for name, capability in named:
            model = self.gpu_model(name)
            rows.append((model, self.capability(capability or (model.capability if model else None))))
        return tuple(rows)

    @_remembered
    def capability(self, capability: str | None) -> Capability | None:
        v = version(capability)
        return None if v is None else self._capabilities.get(v)

    @_remembered
    def min_driver(self, cuda: str | None, windows: bool) -> tuple[str, str] | None:
        """(driver the toolkit lists, driver minor version compatibility allows) for a runtime."""
        wanted = release(cuda)
        if wanted is None:
            return None
        row = next((r for r in self.cuda.releases if release(r.cuda) == wanted), None)
        compat = next((c for c in self.cuda.minor_version_compatibility if c.major == wanted.major), None)
        if row is None and compat is None:
            return None
        own = row or compat
        floor = compat or row
        assert own is not None and floor is not None
        pick = (lambda r: r.windows) if windows else (lambda r: r.linux)
        return pick(own), pick(floor)

    @_remembered
    def torch_release(self, torch_version: str | None) -> TorchRelease | None:
        """The table's row for a torch release; None for a nightly (``2.8.0.dev20250402``) or a
        source or container build (``2.1.0a0+32f93b1``): those pin their own CUDA and NCCL, not
        the release's."""
        v = version(torch_version)
        if v is None or v.is_devrelease or (v.pre is not None and v.pre[0] == "a"):
            return None
        wanted = release(torch_version)
        return next((r for r in self.torch.releases if release(r.torch) == wanted), None)

    @_remembered
    def torch_missing(self, torch_version: str | None) -> tuple[TorchFeature, ...] | None:
        """The features of the torch table that ``torch_version`` predates."""
        v = version(torch_version)
        return None if v is None else tuple(f for f in self.torch.features if v < Version(f.since))

    @_remembered
    def nccl_issues(self, nccl: str | None, archs: tuple[str, ...] | None = None) -> tuple[NcclIssue, ...]:
        """The known defects of an NCCL release; with the job's architectures known, only
        those that occur on them."""
        v = version(nccl)
        found = [i for i in self.nccl.known_issues if v in SpecifierSet(i.versions)] if v else []
        return tuple(i for i in found if not (archs and i.archs) or set(archs) & set(i.archs))

    @_remembered
    def torch_requirement(self, package: str, installed: str | None) -> SpecifierSet | None:
        """What ``package`` at version ``installed`` needs of torch (None: no row covers it)."""
        v = version(installed)
        # pytorch-lightning and lightning are one project released under two names, in step
        rows = self.packages.requirements.get("lightning" if package == "pytorch-lightning" else package, [])
        covering = [r for r in rows if v is not None and Version(r.since) <= v]
        return SpecifierSet(max(covering, key=lambda r: Version(r.since)).torch) if covering else None


def _place(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else f".{part}" if out else str(part)
    return out


def _row_line(text: str, loc: tuple[Any, ...]) -> str:
    # the line of the failing row: the n-th "- " item under the named list, counted in the text
    if len(loc) >= 2 and isinstance(loc[0], str) and isinstance(loc[1], int):
        lines = text.splitlines()
        start = next((i for i, text in enumerate(lines) if re.match(rf"\s*{re.escape(loc[0])}:", text)), None)
        if start is not None:
            items = [i for i in range(start + 1, len(lines)) if re.match(r"\s*- ", lines[i])]
            if loc[1] < len(items):
                return f":{items[loc[1]] + 1}"
    return ""


def load_tables(root: Path | None = None) -> Tables:
    """Read ``tables/*.yaml`` under ``root`` (the shipped kb/); a bad table raises TableError."""
    folder = (root or kb_dir()) / "tables"
    files: dict[str, Any] = {}
    for name, model in _FILES.items():
        path = folder / f"{name}.yaml"
        try:
            text = path.read_text(encoding="utf-8")
            data = yaml.load(text, Loader=SHIPPED_YAML_LOADER)
        except OSError as exc:
            raise TableError(f"{path}: cannot read: {exc.strerror or exc}") from None
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f"{path}:{mark.line + 1}" if mark else str(path)
            raise TableError(f"{where}: invalid YAML: {getattr(exc, 'problem', exc)}") from None
        try:
            files[name] = model.model_validate(data)
        except ValidationError as exc:
            first = exc.errors()[0]
            message = first["msg"].removeprefix("Value error, ")
            raise TableError(f"{path}{_row_line(text, first['loc'])}: {_place(first['loc'])}: {message}") from None
        if name == "gpus":
            known = {version(c.capability) for c in files[name].capabilities}
            for i, m in enumerate(files[name].models):
                if version(m.capability) not in known:
                    where = _row_line(text, ("models", i))
                    raise TableError(
                        f"{path}{where}: models[{i}].capability: no row for compute capability {m.capability}"
                    )
    archs = {c.arch for c in files["gpus"].capabilities}
    for i, issue in enumerate(files["nccl"].known_issues):
        unknown = sorted(set(issue.archs) - archs)
        if unknown:
            path = folder / "nccl.yaml"
            where = _row_line(path.read_text(encoding="utf-8"), ("known_issues", i))
            raise TableError(f"{path}{where}: known_issues[{i}].archs: not an architecture of gpus.yaml: {unknown}")
    return Tables(files)


@functools.cache
def shipped() -> Tables:
    return load_tables()
