"""probes.env: the allow-list, redaction of credentials, CUDA_VISIBLE_DEVICES parsing."""

from __future__ import annotations

import pytest

from probes import env
from probes.env import REDACTED

SECRETS = {
    "HF_TOKEN": "hf_QwErTyUiOpAsDfGhJkLzXcVbNm123456",
    "WANDB_API_KEY": "0123456789abcdef0123456789abcdef01234567",
    "AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
    "MY_PASSWORD": "hunter2-correct-horse",
}


def test_keeps_only_allow_listed_names() -> None:
    found = env.probe(
        {
            "NCCL_DEBUG": "INFO",
            "NCCL_P2P_DISABLE": "1",
            "CUDA_VISIBLE_DEVICES": "0,1",
            "MASTER_ADDR": "10.0.0.1",
            "OMP_NUM_THREADS": "8",
            "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
            "GLOO_SOCKET_IFNAME": "eth0",
            "NVIDIA_VISIBLE_DEVICES": "all",
            "HOME": "/root",
            "PATH": "/usr/bin",
            "LD_LIBRARY_PATH": "/usr/local/cuda/lib64",
            **SECRETS,
        }
    )
    assert found.values == {
        "CUDA_VISIBLE_DEVICES": "0,1",
        "GLOO_SOCKET_IFNAME": "eth0",
        "MASTER_ADDR": "10.0.0.1",
        "NCCL_DEBUG": "INFO",
        "NCCL_P2P_DISABLE": "1",
        "NVIDIA_VISIBLE_DEVICES": "all",
        "OMP_NUM_THREADS": "8",
        "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
    }
    assert found.complete and found.source == "live"
    assert found.lookup("NCCL_IB_DISABLE") == (True, None)


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("TORCH_HUB_TOKEN", "anything"),  # the name says credential
        ("SLURM_JOB_AUTH", "x"),
        ("NCCL_IB_PKEY", "0x8001"),  # the rule: KEY in a name is redacted, even here
        ("TORCH_HOME", "https://alice:s3cretpass@example.com/cache"),
        ("CUDA_CACHE_PATH", "hf_QwErTyUiOpAsDfGhJkLzXcVbNm123456"),
        ("NCCL_SOCKET_IFNAME", "AKIAIOSFODNN7EXAMPLE"),
        ("TORCH_X", "ghp_0123456789abcdefghijABCDEFGHIJ012345"),
        ("TORCH_Y", "Zm9vYmFyQmF6UXV4MTIzNDU2Nzg5MEFiQ2RFZg"),  # opaque mixed-case run
    ],
)
def test_redacts_credential_names_and_values(name: str, value: str) -> None:
    assert env.probe({name: value}).values == {name: REDACTED}


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("CUDA_HOME", "/usr/local/cuda-12.1"),
        ("NCCL_SOCKET_IFNAME", "^docker0,lo"),
        ("TORCHELASTIC_RUN_ID", "8b1a9953c4611296a827abf8c47804d7"),  # hex ids are not keys
        ("NCCL_TOPO_FILE", "/opt/microsoft/ndv4-topo.xml"),
        ("SLURM_JOB_NODELIST", "gpu-node-[001-004]"),
        ("TORCH_HOME", "/home/Alice/models/Llama2/checkpoints"),
    ],
)
def test_keeps_ordinary_values(name: str, value: str) -> None:
    assert env.probe({name: value}).values == {name: value}


def test_redact_text_in_a_command_line() -> None:
    text = "python train.py --hf_token hf_QwErTyUiOpAsDfGhJkLzXcVbNm123456 --api-key=abc WANDB_API_KEY=xyz --lr 0.1"
    assert env.redact_text(text) == (
        f"python train.py --hf_token {REDACTED} --api-key={REDACTED} WANDB_API_KEY={REDACTED} --lr 0.1"
    )


@pytest.mark.parametrize(
    ("value", "parsed"),
    [
        (None, None),
        ("", []),
        ("0,1", ["0", "1"]),
        (" 2, 3 ", ["2", "3"]),
        ("0,0", ["0", "0"]),
        ("GPU-5e3f8a1c-aaaa-bbbb-cccc-0123456789ab,1", ["GPU-5e3f8a1c-aaaa-bbbb-cccc-0123456789ab", "1"]),
        ("MIG-GPU-5e3f8a1c/1/0", ["MIG-GPU-5e3f8a1c/1/0"]),
    ],
)
def test_parse_visible_devices(value: str | None, parsed: list[str] | None) -> None:
    assert env.parse_visible_devices(value) == parsed
