"""deploy/ hangs together: the policy in the ConfigMap loads, the webhooks send exactly the
kinds the server reviews to the paths it serves, names and ports agree, and make-cert.sh makes
a certificate the API server would accept for the Service."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from kernelbake.admission.policy import AdmissionPolicy
from kernelbake.admission.review import GroupKind
from kernelbake.admission.verifying import verify_policy
from kernelbake.admission.workloads import POD_SPEC_PATHS
from tests.conftest import REPO

DEPLOY = REPO / "deploy"
RESOURCE_KINDS = {
    "pods": "Pod",
    "pods/ephemeralcontainers": "Pod",
    "replicationcontrollers": "ReplicationController",
    "podtemplates": "PodTemplate",
    "deployments": "Deployment",
    "statefulsets": "StatefulSet",
    "daemonsets": "DaemonSet",
    "replicasets": "ReplicaSet",
    "jobs": "Job",
    "cronjobs": "CronJob",
}


def manifests() -> dict[str, dict[str, Any]]:
    kustomization = yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())
    out: dict[str, dict[str, Any]] = {}
    for name in kustomization["resources"]:
        for doc in yaml.safe_load_all((DEPLOY / name).read_text()):
            out[f"{doc['kind']}/{doc['metadata']['name']}"] = doc
    return out


@pytest.fixture(scope="module")
def docs() -> dict[str, dict[str, Any]]:
    return manifests()


def policy(docs: dict[str, dict[str, Any]]) -> AdmissionPolicy:
    text = docs["ConfigMap/kernelbake-admission-policy"]["data"]["policy.yaml"]
    return AdmissionPolicy.from_mapping(yaml.safe_load(text), source="policy-configmap.yaml")


def test_the_shipped_policy_loads_with_its_trust_section(docs: dict[str, dict[str, Any]]) -> None:
    p = policy(docs)
    assert verify_policy(p).identities
    assert p.governs("registry.example.com/kernelbake/qwen3-8b")


@pytest.mark.parametrize("kind", ["MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"])
def test_webhooks_send_what_the_server_reviews(docs: dict[str, dict[str, Any]], kind: str) -> None:
    (hook,) = docs[f"{kind}/kernelbake-admission"]["webhooks"]
    assert hook["admissionReviewVersions"] == ["v1"]
    assert hook["sideEffects"] == "None" and hook["failurePolicy"] == "Fail"
    assert hook["timeoutSeconds"] > policy(docs).deadline_seconds
    service = hook["clientConfig"]["service"]
    assert service["path"] == ("/mutate" if kind.startswith("Mutating") else "/validate")
    svc = docs[f"Service/{service['name']}"]
    assert svc["metadata"]["namespace"] == service["namespace"]
    assert [p["port"] for p in svc["spec"]["ports"]] == [service["port"]]
    reviewed = set()
    for rule in hook["rules"]:
        assert set(rule["operations"]) == {"CREATE", "UPDATE"}
        for resource in rule["resources"]:
            reviewed.add(GroupKind(rule["apiGroups"][0], RESOURCE_KINDS[resource]))
    assert reviewed == set(POD_SPEC_PATHS)
    excluded = hook["namespaceSelector"]["matchExpressions"][0]
    assert excluded["operator"] == "NotIn" and service["namespace"] in excluded["values"]


def test_the_deployment_serves_what_the_service_and_secret_name(docs: dict[str, dict[str, Any]]) -> None:
    deployment = docs["Deployment/kernelbake-admission"]
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    args = dict(a.split("=", 1) for a in container["args"][1:])
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert args["--policy"] == f"{mounts['policy']}/policy.yaml"
    assert volumes["policy"]["configMap"]["name"] == "kernelbake-admission-policy"
    assert args["--tls-cert"] == f"{mounts['tls']}/tls.crt"
    # make-cert.sh --apply creates <service>-tls.
    assert volumes["tls"]["secret"]["secretName"] == "kernelbake-admission-tls"
    assert container["ports"][0]["containerPort"] == int(args["--port"])
    assert (
        docs["Service/kernelbake-admission"]["spec"]["ports"][0]["targetPort"]
        == container["ports"][0]["name"]
    )
    assert deployment["spec"]["replicas"] >= 2


def test_make_cert_gives_a_certificate_for_the_service(tmp_path: Path) -> None:
    done = subprocess.run(
        [str(DEPLOY / "make-cert.sh"), "--out", str(tmp_path)], capture_output=True, text=True, check=True
    )
    assert "kubectl -n kernelbake-system create secret tls kernelbake-admission-tls" in done.stdout
    for host in (
        "kernelbake-admission.kernelbake-system.svc",
        "kernelbake-admission.kernelbake-system.svc.cluster.local",
    ):
        subprocess.run(
            [
                "openssl",
                "verify",
                "-CAfile",
                str(tmp_path / "ca.crt"),
                "-verify_hostname",
                host,
                "-purpose",
                "sslserver",
                str(tmp_path / "tls.crt"),
            ],
            check=True,
            capture_output=True,
        )
    assert (tmp_path / "tls.key").stat().st_mode & 0o077 == 0
    bad = subprocess.run([str(DEPLOY / "make-cert.sh")], capture_output=True, text=True)
    assert bad.returncode == 2 and "--out DIR is required" in bad.stderr
