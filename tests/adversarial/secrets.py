"""Planted credentials: each a line as it would appear in a log, a command line or an
environment value, and the secret in it that must never leave the tool.

The secrets are made up but shaped like the real thing (lengths, alphabets, prefixes).
"""

from __future__ import annotations

HEX40 = "3f9a6c2b8e1d4f7a0b5c9e2d6a8f1c3b7e4d0a92"
JWT = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJhbGljZSIsImV4cCI6MTcwMDAwMH0.c2lnbmF0dXJlX3NpZ25hdHVyZQ"

# (line, secret)
PLANTED: list[tuple[str, str]] = [
    # URL user-info
    ("MASTER_ADDR=http://admin:Pw9secretX@host01", "Pw9secretX"),
    ("connecting to postgres://trainer:p/a$s@w0rd@db.internal:5432/runs", "p/a$s@w0rd"),
    ("git clone https://oauth2:glTokenValue123abc@gitlab.example.com/x.git", "glTokenValue123abc"),
    ("redis://:Redis_Pa55w0rd@cache:6379/0", "Redis_Pa55w0rd"),
    ("mlflow uri=https://bob:hunter2hunter2@mlflow.corp/", "hunter2hunter2"),
    # authorization headers and schemes
    ("Authorization: Bearer abcDEF123ghiJKL456", "abcDEF123ghiJKL456"),
    ("Authorization: Basic dXNlcjpwYXNzd29yZA==", "dXNlcjpwYXNzd29yZA=="),
    ("proxy-authorization: Basic YWxpY2U6c2VjcmV0", "YWxpY2U6c2VjcmV0"),
    ('headers = {"Authorization": "token ghsecretvalue42"}', "ghsecretvalue42"),
    ("X-Api-Key: 9f8e7d6c5b4a39281706", "9f8e7d6c5b4a39281706"),
    ("x-auth-token: tok_live_abcdef012345", "tok_live_abcdef012345"),
    ("Cookie: sessionid=sess0123456789abcd; csrftoken=abc", "sess0123456789abcd"),
    ("RuntimeError: request failed: Bearer zzTopSecretBearer99 rejected", "zzTopSecretBearer99"),
    # key=value, key: value
    ('NCCL_DEBUG_SUBSYS="INIT password=Sup3rS3cret!"', "Sup3rS3cret!"),
    ("password: correct-horse-battery", "correct-horse-battery"),
    ("db_password=letmein2024", "letmein2024"),
    ("WANDB_API_KEY=" + HEX40, HEX40),
    ("HF_TOKEN=not_a_shaped_token_but_named", "not_a_shaped_token_but_named"),
    (
        "export AWS_SECRET_ACCESS_KEY=wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
        "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
    ),
    ("hparams: {'lr': 0.1, 'api_key': 'abc123def456', 'epochs': 3}", "abc123def456"),
    ("hparams: {'password': 'pw-in-hparams', 'batch_size': 8}", "pw-in-hparams"),
    ("{'token': 'tok-in-dict-777', 'seed': 1}", "tok-in-dict-777"),
    ('{"token": "json-token-value-42", "step": 10}', "json-token-value-42"),
    ('{"client_secret": "cs-9876-abcd"}', "cs-9876-abcd"),
    ("loading s3://bucket/ckpt.pt?X-Amz-Signature=deadbeefcafe1234&X-Amz-Date=2024", "deadbeefcafe1234"),
    ("GET /models/x.bin?token=urltoken_5566&rev=main", "urltoken_5566"),
    ("secret_key = 'flask-secret-abc'", "flask-secret-abc"),
    ("private_key: pk-material-9911", "pk-material-9911"),
    ("credentials=cred-blob-4242", "cred-blob-4242"),
    ("passphrase: open-sesame-1", "open-sesame-1"),
    # command lines
    ("python train.py --password Hunter2Hunter --lr 0.1", "Hunter2Hunter"),
    ("python train.py --wandb-key " + HEX40[::-1], HEX40[::-1]),
    ("python train.py --hf_token plain-value-xyz --epochs 1", "plain-value-xyz"),
    ("python train.py --api-key=key-eq-form-1", "key-eq-form-1"),
    ("OMPI_MCA_plm_rsh_agent=sshpass -p SshPassW0rd ssh", "SshPassW0rd"),
    ("wandb login " + HEX40, HEX40),
    ("wandb login --relogin " + "0123456789abcdef0123456789abcdef01234567", "0123456789abcdef0123456789abcdef01234567"),
    # known token shapes, bare
    ("token hf_AbCdEfGhIjKlMnOpQrStUvWxYz0123456789 in use", "hf_AbCdEfGhIjKlMnOpQrStUvWxYz0123456789"),
    ("ghp_0123456789abcdefghijABCDEFGHIJ012345 pushed", "ghp_0123456789abcdefghijABCDEFGHIJ012345"),
    ("using github_pat_11ABCDEFG0123456789_abcdefghijklmnop", "github_pat_11ABCDEFG0123456789_abcdefghijklmnop"),
    ("key sk-proj-AbCdEfGhIjKlMnOpQrStUvWx0123", "sk-proj-AbCdEfGhIjKlMnOpQrStUvWx0123"),
    ("anthropic sk-ant-api03-AbCdEfGhIjKlMnOpQrSt", "sk-ant-api03-AbCdEfGhIjKlMnOpQrSt"),
    ("aws AKIAIOSFODNN7EXAMPLE region", "AKIAIOSFODNN7EXAMPLE"),
    ("sts ASIAJEXAMPLEXEG2JICE used", "ASIAJEXAMPLEXEG2JICE"),
    ("gcp ya29.a0AfH6SMBexampleAccessTokenValue123", "ya29.a0AfH6SMBexampleAccessTokenValue123"),
    ("maps AIzaSyA-abcdefghijklmnopqrstuvwxyz01234", "AIzaSyA-abcdefghijklmnopqrstuvwxyz01234"),
    ("jwt " + JWT, JWT),
    ("slack xoxb-123456789012-abcdefABCDEF", "xoxb-123456789012-abcdefABCDEF"),
    ("gitlab glpat-AbCdEfGhIjKlMnOpQrSt", "glpat-AbCdEfGhIjKlMnOpQrSt"),
    ("npm npm_AbCdEfGhIjKlMnOpQrStUvWxYz0123456789", "npm_AbCdEfGhIjKlMnOpQrStUvWxYz0123456789"),
    ("stripe sk_live_AbCdEfGhIjKlMnOp1234", "sk_live_AbCdEfGhIjKlMnOp1234"),
    ("opaque Zm9vYmFyQmF6UXV4MTIzNDU2Nzg5MEFiQ2RFZg here", "Zm9vYmFyQmF6UXV4MTIzNDU2Nzg5MEFiQ2RFZg"),
    ("SLURM_JOB_NAME=run Bearer slurmBearerTok123", "slurmBearerTok123"),
]

PRIVATE_KEY_LINES = [
    "-----BEGIN OPENSSH PRIVATE KEY-----",
    "b3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQAAAAAAAAABAAAAMwAAAAtzc2gtZW",
    "QyNTUxOQAAACBdZXhhbXBsZWtleW1hdGVyaWFsZXhhbXBsZWtleW1hdGVyaWFsAAAAkN",
    "kTail9Q==",
    "-----END OPENSSH PRIVATE KEY-----",
]
# the body lines, the short last one above all, carry nothing a shape rule could catch
PRIVATE_KEY_SECRETS = PRIVATE_KEY_LINES[1:4]

# allow-listed environment variables whose values hide credentials (name -> value, secret)
ENV_VALUES: list[tuple[str, str, str]] = [
    ("NCCL_DEBUG_SUBSYS", "INIT password=EnvPw12345", "EnvPw12345"),
    ("SLURM_JOB_COMMENT", "wandb " + HEX40, HEX40),
    ("SLURM_JOB_NAME", "job Bearer envBearerTok9876", "envBearerTok9876"),
    ("TORCH_HOME", "/data/models?token=envPathTok42", "envPathTok42"),
    ("OMPI_MCA_plm_rsh_agent", "sshpass -p OmpiSshPw77 ssh", "OmpiSshPw77"),
    ("MASTER_ADDR", "http://admin:MasterPw55@node01", "MasterPw55"),
]

ALL_SECRETS = [s for _, s in PLANTED] + PRIVATE_KEY_SECRETS + [s for _, _, s in ENV_VALUES]
