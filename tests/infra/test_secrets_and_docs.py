"""No real secret in the shipped deployment files, and a deployment guide that points at
files and commands that exist."""

from __future__ import annotations

import base64
import random
import re
from pathlib import Path

import pytest

from app.lib.vault import generate_key_spec
from tests.support.infra import (
    DEPLOYMENT_DOC,
    INFRA,
    K8S,
    PLACEHOLDER,
    ROOT,
    real_looking_secrets,
)


def shipped_files() -> list[Path]:
    files = [p for p in INFRA.rglob("*") if p.is_file() and p.name != ".env"]
    return [*sorted(files), DEPLOYMENT_DOC]


# Seeded, so the cases are the same on every run (the shapes of secrets.token_urlsafe,
# secrets.token_hex and generate_key_spec).
_RANDOM = random.Random(20261130)


def _urlsafe(size: int) -> str:
    return base64.urlsafe_b64encode(_RANDOM.randbytes(size)).decode().rstrip("=")


@pytest.mark.parametrize(
    "secret",
    [
        _urlsafe(48),
        _RANDOM.randbytes(32).hex(),
        "k1:" + base64.b64encode(_RANDOM.randbytes(32)).decode(),
        "sk-" + _urlsafe(24),
        "ak-" + _urlsafe(24),
        "-----BEGIN PRIVATE KEY-----",
    ],
)
def test_the_detector_finds_generated_secrets(secret: str) -> None:
    assert real_looking_secrets(f'ARONA_JWT_SECRET: "{secret}"\n')


def test_the_detector_finds_a_fresh_vault_key() -> None:
    assert real_looking_secrets(f"ARONA_VAULT_KEYS={generate_key_spec('k1')}")


@pytest.mark.parametrize(
    "text",
    [
        f"ARONA_JWT_SECRET={PLACEHOLDER}",
        f"postgresql+asyncpg://arona:{PLACEHOLDER}@{PLACEHOLDER}:5432/arona",
        "preferredDuringSchedulingIgnoredDuringExecution: app.kubernetes.io/component",
        "ARONA_HEALTH_INTERVAL_SECONDS: 60",
        "kubectl -n arona apply -f infra/k8s/migrate-job.yaml",
        "ARONA_VAULT_KEYS: kid:base64-of-32-random-bytes",
    ],
)
def test_the_detector_passes_placeholders_and_manifest_words(text: str) -> None:
    assert real_looking_secrets(text) == []


def test_no_shipped_file_holds_a_real_looking_secret() -> None:
    files = shipped_files()
    assert {INFRA / ".env.example", K8S / "secret.template.yaml"} <= set(files)
    found = {
        str(path.relative_to(ROOT)): hits
        for path in files
        if (hits := real_looking_secrets(path.read_text()))
    }
    assert found == {}


def test_deployment_guide_is_linked_from_the_readme() -> None:
    readme = (ROOT / "README.md").read_text()
    assert "(docs/deployment.md)" in readme


def test_deployment_guide_names_only_files_that_exist() -> None:
    text = DEPLOYMENT_DOC.read_text()
    named = set(re.findall(r"\b((?:infra|docs|app)/[\w./-]+\.(?:ya?ml|md|py|conf|example))", text))
    assert named
    missing = sorted(name for name in named if not (ROOT / name).exists())
    assert missing == []


def test_deployment_guide_applies_kubernetes_in_order() -> None:
    text = DEPLOYMENT_DOC.read_text()
    steps = [
        "secret",
        "configmap.yaml",
        "migrate-job.yaml",
        "condition=complete job/arona-migrate",
        "deployment.yaml",
        "service.yaml",
        "hpa.yaml",
        "pdb.yaml",
    ]
    section = text[text.index("## Kubernetes") :]
    blocks = re.findall(r"```sh\n(.*?)```", section, flags=re.DOTALL)
    (install,) = [block for block in blocks if "kubectl create namespace" in block]
    positions = [install.find(step) for step in steps]
    assert -1 not in positions, dict(zip(steps, positions, strict=True))
    assert positions == sorted(positions)
