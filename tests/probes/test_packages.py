"""probes.packages: versions from installed metadata, never by importing."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from email.message import Message
from importlib import metadata

import pytest

from probes import packages

_NEEDS = pytest.mark.skipif(
    importlib.util.find_spec("torch") is None or importlib.util.find_spec("lightning") is None,
    reason="needs torch and lightning installed",
)


class Dist(metadata.Distribution):
    def __init__(self, name: str | None, version: str) -> None:
        self._name, self._version = name, version

    def read_text(self, filename: str) -> str | None:
        return None

    def locate_file(self, path):  # noqa: ANN001, ANN201
        return path

    @property
    def metadata(self) -> Message:  # type: ignore[override]
        msg = Message()
        if self._name:
            msg["Name"] = self._name
        return msg

    @property
    def version(self) -> str:
        return self._version


def test_names_are_pep503_and_the_first_copy_wins() -> None:
    found = packages.probe(
        [
            Dist("PyTorch_Lightning", "1.9.5"),
            Dist("lightning", "2.6.6"),
            Dist("pytorch-lightning", "2.0.0"),  # shadowed further down sys.path
            Dist(None, "0"),  # a .dist-info without METADATA
            Dist("nvidia-nccl-cu12", "2.20.5"),
        ]
    )
    assert found.values == {"pytorch-lightning": "1.9.5", "lightning": "2.6.6", "nvidia-nccl-cu12": "2.20.5"}
    assert found.complete and found.lookup("PYTORCH_LIGHTNING") == (True, "1.9.5")
    assert found.lookup("deepspeed") == (True, None)


@_NEEDS
def test_this_environment_without_importing_torch() -> None:
    code = (
        "import sys; from probes import packages; found = packages.probe();"
        "print(found.values['torch'], found.values['lightning'], 'torch' in sys.modules, 'lightning' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    torch_version, lightning_version, torch_imported, lightning_imported = out.stdout.split()
    assert (torch_version, lightning_version) == (metadata.version("torch"), metadata.version("lightning"))
    assert (torch_imported, lightning_imported) == ("False", "False")
