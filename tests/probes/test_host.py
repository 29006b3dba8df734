"""probes.host against a planted root directory, and for real on this machine."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from probes import host


def plant(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def no_ancestors() -> list[str]:
    return []


def test_reads_os_release_shm_and_docker(tmp_path: Path) -> None:
    root = plant(tmp_path, {"etc/os-release": 'NAME="Ubuntu"\nPRETTY_NAME="Ubuntu 22.04.4 LTS"\n', ".dockerenv": ""})
    (root / "dev/shm").mkdir(parents=True)
    found = host.probe(root=root, environ={}, ancestors=no_ancestors)
    assert found.os == "Ubuntu 22.04.4 LTS"
    assert found.container == "docker"
    usage = shutil.disk_usage(root / "dev/shm")
    assert found.shm_total_bytes == usage.total
    assert found.interactive is False


def test_missing_shm_is_a_reason(tmp_path: Path) -> None:
    found = host.probe(root=tmp_path, environ={}, ancestors=no_ancestors)
    assert found.shm_total_bytes is None
    assert found.unavailable["shm_total_bytes"].endswith("dev/shm: No such file or directory")
    assert found.container == "none"


@pytest.mark.parametrize(
    ("files", "environ", "kind"),
    [
        ({"proc/1/cgroup": "0::/kubepods/besteffort/pod1234/abcd\n"}, {}, "kubernetes"),
        ({}, {"KUBERNETES_SERVICE_HOST": "10.96.0.1"}, "kubernetes"),
        ({"run/.containerenv": ""}, {}, "podman"),
        ({"proc/1/cgroup": "12:devices:/lxc/gpu-box\n"}, {}, "lxc"),
        ({"proc/1/cgroup": "0::/init.scope\n"}, {}, "none"),
    ],
)
def test_container_kinds(tmp_path: Path, files: dict[str, str], environ: dict[str, str], kind: str) -> None:
    assert host.detect_container(plant(tmp_path, files), environ) == kind


def test_interactive_from_the_environment_or_an_ancestor() -> None:
    assert host.detect_interactive({"JPY_PARENT_PID": "17"}, no_ancestors) is True
    assert host.detect_interactive({"COLAB_RELEASE_TAG": "release-colab"}, no_ancestors) is True
    ancestors = lambda: ["/usr/bin/python3 -m ipykernel_launcher -f /root/.local/kernel-1.json", "bash"]  # noqa: E731
    assert host.detect_interactive({}, ancestors) is True
    assert host.detect_interactive({}, lambda: ["bash", "sshd: root@pts/0"]) is False


def test_this_machine() -> None:
    found = host.probe()
    assert found.source == "live" and found.platform == "linux"
    assert found.cpu_count == len(os.sched_getaffinity(0))
    assert found.memory_total_bytes > found.memory_available_bytes > 0
    assert found.shm_total_bytes == shutil.disk_usage("/dev/shm").total
    assert found.memlock_limit_bytes == -1 or found.memlock_limit_bytes >= 0
    assert found.kernel == os.uname().release
    assert found.unavailable == {}
