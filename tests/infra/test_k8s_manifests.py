"""The Kubernetes manifests: every one checked against the Kubernetes JSON schemas (the
``kubernetes-validate`` package ships them, so no cluster and no network is needed), and
their settings checked against the code they deploy."""

from __future__ import annotations

import copy
import secrets
from typing import Any

import kubernetes_validate  # type: ignore[import-untyped]
import pytest
from kubernetes_validate.utils import all_versions  # type: ignore[import-untyped]
from packaging.version import Version

from app.cli.common import GRACEFUL_SHUTDOWN_SECONDS
from app.lib.settings import DEFAULT_PORT, SettingsError, load_settings, parse_vault_keys
from app.lib.vault import generate_key_spec
from tests.support.infra import (
    K8S,
    PLACEHOLDER,
    SECRET_SETTINGS,
    known_settings,
    load_yaml,
    load_yaml_documents,
)

# The oldest Kubernetes minor the manifests must still apply to; every newer one whose
# schemas the validator ships is checked too.
OLDEST_KUBERNETES = "1.29"
NOT_RESOURCES = {"kustomization.yaml"}


def kubernetes_versions() -> list[str]:
    versions = sorted({Version(v) for v in all_versions()})
    return [f"{v.major}.{v.minor}" for v in versions if v >= Version(OLDEST_KUBERNETES)]


def manifests() -> dict[str, dict[str, Any]]:
    found: dict[str, dict[str, Any]] = {}
    for path in sorted(K8S.glob("*.yaml")):
        if path.name in NOT_RESOURCES:
            continue
        for doc in load_yaml_documents(path):
            found[f"{doc['kind']}/{doc['metadata']['name']}"] = doc
    return found


@pytest.fixture(scope="module")
def resources() -> dict[str, dict[str, Any]]:
    return manifests()


def pod_spec(resource: dict[str, Any]) -> dict[str, Any]:
    return resource["spec"]["template"]["spec"]  # type: ignore[no-any-return]


def only_container(resource: dict[str, Any]) -> dict[str, Any]:
    (container,) = pod_spec(resource)["containers"]
    return container  # type: ignore[no-any-return]


def test_every_manifest_is_valid_against_the_kubernetes_schemas(
    resources: dict[str, dict[str, Any]],
) -> None:
    assert set(resources) == {
        "ConfigMap/arona-config",
        "Secret/arona-secrets",
        "Deployment/arona",
        "Service/arona",
        "HorizontalPodAutoscaler/arona",
        "PodDisruptionBudget/arona",
        "Job/arona-migrate",
    }
    versions = kubernetes_versions()
    assert len(versions) >= 2
    for _name, resource in resources.items():
        for version in versions:
            # strict: an unknown or misspelt field is an error, not ignored.
            kubernetes_validate.validate(resource, version, strict=True)


def test_the_validator_rejects_broken_manifests(resources: dict[str, dict[str, Any]]) -> None:
    deployment = resources["Deployment/arona"]
    misspelt = copy.deepcopy(deployment)
    only_container(misspelt)["readinessProbe"]["httpGet"]["pathh"] = "/readyz"
    wrong_type = copy.deepcopy(deployment)
    only_container(wrong_type)["ports"][0]["containerPort"] = str(DEFAULT_PORT)
    for broken in (misspelt, wrong_type):
        with pytest.raises(kubernetes_validate.ValidationError):
            kubernetes_validate.validate(broken, kubernetes_versions()[-1], strict=True)


def test_kustomization_lists_the_steady_state_resources() -> None:
    kustomization = load_yaml(K8S / "kustomization.yaml")
    assert kustomization["kind"] == "Kustomization"
    listed = set(kustomization["resources"])
    files = {path.name for path in K8S.glob("*.yaml")} - NOT_RESOURCES
    # The secret is a template, and the Job must finish before the Deployment rolls.
    assert listed == files - {"secret.template.yaml", "migrate-job.yaml"}


def test_deployment_rolls_without_losing_capacity(resources: dict[str, dict[str, Any]]) -> None:
    deployment = resources["Deployment/arona"]
    spec = deployment["spec"]
    assert spec["replicas"] == 3
    assert spec["strategy"]["type"] == "RollingUpdate"
    assert spec["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    assert spec["selector"]["matchLabels"].items() <= spec["template"]["metadata"]["labels"].items()
    container = only_container(deployment)
    assert container["args"] == ["serve"]


def test_deployment_probes_hit_the_app_endpoints(resources: dict[str, dict[str, Any]]) -> None:
    container = only_container(resources["Deployment/arona"])
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    assert ports == {"http": DEFAULT_PORT}
    expected = {
        # Degraded pods still serve: a shared outage must not empty the Service.
        "readinessProbe": "/readyz?allow_degraded=true",
        "livenessProbe": "/healthz",
        "startupProbe": "/healthz",
    }
    for probe, path in expected.items():
        get = container[probe]["httpGet"]
        assert get["path"] == path
        assert ports.get(get["port"], get["port"]) == DEFAULT_PORT


def test_deployment_drains_before_it_is_killed(resources: dict[str, dict[str, Any]]) -> None:
    deployment = resources["Deployment/arona"]
    command = only_container(deployment)["lifecycle"]["preStop"]["exec"]["command"]
    assert command[0] == "sleep"
    pre_stop = int(command[1])
    assert pre_stop >= 5, "the Service must stop sending before SIGTERM"
    grace = pod_spec(deployment)["terminationGracePeriodSeconds"]
    # The grace period runs from the start of preStop; the usage writer flushes last.
    assert grace >= pre_stop + GRACEFUL_SHUTDOWN_SECONDS + 5


def test_deployment_resources_are_sized(resources: dict[str, dict[str, Any]]) -> None:
    limits = only_container(resources["Deployment/arona"])["resources"]
    assert set(limits["requests"]) == set(limits["limits"]) == {"cpu", "memory"}
    assert limits["requests"]["cpu"] == "1"  # one event loop: one core
    # docs/performance.md: ~165 MB under load, plus ~22 KB per open stream.
    assert _mebibytes(limits["requests"]["memory"]) >= 200
    assert _mebibytes(limits["limits"]["memory"]) >= 2 * _mebibytes(limits["requests"]["memory"])


def _mebibytes(quantity: str) -> int:
    assert quantity.endswith(("Mi", "Gi")), quantity
    return int(quantity[:-2]) * (1024 if quantity.endswith("Gi") else 1)


@pytest.mark.parametrize("name", ["Deployment/arona", "Job/arona-migrate"])
def test_pods_are_locked_down(resources: dict[str, dict[str, Any]], name: str) -> None:
    spec = pod_spec(resources[name])
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["runAsUser"] > 0
    assert spec["automountServiceAccountToken"] is False
    # A Service named "arona" would otherwise inject ARONA_PORT=tcp://..., which the
    # settings loader rejects.
    assert spec["enableServiceLinks"] is False
    container = only_container(resources[name])
    context = container["securityContext"]
    assert context["readOnlyRootFilesystem"] is True
    assert context["allowPrivilegeEscalation"] is False
    assert context["capabilities"]["drop"] == ["ALL"]
    mounts = {mount["mountPath"]: mount["name"] for mount in container["volumeMounts"]}
    volumes = {volume["name"]: volume for volume in spec["volumes"]}
    assert "emptyDir" in volumes[mounts["/tmp"]]  # noqa: S108 (the pod's own /tmp)
    refs = [(k, v["name"]) for source in container["envFrom"] for k, v in source.items()]
    assert refs == [("configMapRef", "arona-config"), ("secretRef", "arona-secrets")]


def test_deployment_spreads_across_nodes(resources: dict[str, dict[str, Any]]) -> None:
    spec = pod_spec(resources["Deployment/arona"])
    selector = resources["Deployment/arona"]["spec"]["selector"]["matchLabels"]
    spreads = {c["topologyKey"]: c for c in spec["topologySpreadConstraints"]}
    assert spreads["kubernetes.io/hostname"]["labelSelector"]["matchLabels"] == selector
    (term,) = spec["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert term["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"


def test_service_reaches_only_the_server_pods(resources: dict[str, dict[str, Any]]) -> None:
    service = resources["Service/arona"]["spec"]
    assert service["type"] == "ClusterIP"
    (port,) = service["ports"]
    assert port["port"] == 80
    container = only_container(resources["Deployment/arona"])
    named = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert named.get(port["targetPort"], port["targetPort"]) == DEFAULT_PORT
    server_labels = resources["Deployment/arona"]["spec"]["template"]["metadata"]["labels"]
    job_labels = resources["Job/arona-migrate"]["spec"]["template"]["metadata"]["labels"]
    assert service["selector"].items() <= server_labels.items()
    assert not service["selector"].items() <= job_labels.items()


def test_autoscaler_and_disruption_budget(resources: dict[str, dict[str, Any]]) -> None:
    deployment = resources["Deployment/arona"]
    hpa = resources["HorizontalPodAutoscaler/arona"]
    assert hpa["apiVersion"] == "autoscaling/v2"
    target = hpa["spec"]["scaleTargetRef"]
    assert (target["kind"], target["name"]) == ("Deployment", deployment["metadata"]["name"])
    assert hpa["spec"]["minReplicas"] == deployment["spec"]["replicas"] == 3
    assert hpa["spec"]["maxReplicas"] > hpa["spec"]["minReplicas"]
    (metric,) = hpa["spec"]["metrics"]
    assert metric["resource"]["name"] == "cpu"
    assert metric["resource"]["target"]["type"] == "Utilization"
    pdb = resources["PodDisruptionBudget/arona"]["spec"]
    assert pdb["selector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]
    if "maxUnavailable" in pdb:
        assert pdb["maxUnavailable"] == 1
    else:
        assert hpa["spec"]["minReplicas"] - pdb["minAvailable"] >= 1


def test_migration_job_runs_the_serving_image_once(resources: dict[str, dict[str, Any]]) -> None:
    job = resources["Job/arona-migrate"]
    container = only_container(job)
    assert container["args"] == ["migrate"]
    assert container["image"] == only_container(resources["Deployment/arona"])["image"]
    assert job["spec"]["backoffLimit"] >= 1
    assert job["spec"]["ttlSecondsAfterFinished"] > 0
    assert pod_spec(job)["restartPolicy"] in ("Never", "OnFailure")
    assert "deployment/arona" in job["metadata"]["annotations"]["arona/run-order"]


def test_configmap_holds_valid_non_secret_settings(resources: dict[str, dict[str, Any]]) -> None:
    data = resources["ConfigMap/arona-config"]["data"]
    assert set(data) <= known_settings()
    assert not set(data) & SECRET_SETTINGS
    secret_values = {
        "ARONA_DATABASE_URL": "postgresql+asyncpg://arona:pw@db:5432/arona",
        "ARONA_REDIS_URL": "redis://redis:6379/0",
        "ARONA_JWT_SECRET": secrets.token_urlsafe(48),
        "ARONA_VAULT_KEYS": generate_key_spec("k1"),
    }
    settings = load_settings({**data, **secret_values})
    settings.validate()
    assert (settings.host, settings.port, settings.log_format) == ("0.0.0.0", DEFAULT_PORT, "json")


def test_secret_template_has_only_placeholders(resources: dict[str, dict[str, Any]]) -> None:
    secret = resources["Secret/arona-secrets"]
    assert "data" not in secret, "base64 data would hide what is in the template"
    values = secret["stringData"]
    assert set(values) == SECRET_SETTINGS
    for name, value in values.items():
        if name == "ARONA_ADMIN_TOKEN":
            # A placeholder left in place would be a working admin password.
            assert value == ""
        else:
            assert PLACEHOLDER in value, name
    # An unfilled copy cannot start a server.
    with pytest.raises(SettingsError):
        parse_vault_keys(values["ARONA_VAULT_KEYS"])
    settings = load_settings({"ARONA_JWT_SECRET": values["ARONA_JWT_SECRET"]})
    with pytest.raises(SettingsError, match="ARONA_JWT_SECRET"):
        settings.validate()
    assert load_settings({"ARONA_ADMIN_TOKEN": values["ARONA_ADMIN_TOKEN"]}).admin_token is None
