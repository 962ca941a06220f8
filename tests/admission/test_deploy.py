"""deploy/ hangs together: the policy in the ConfigMap loads, the webhooks send exactly the
kinds the server reviews to the paths it serves, names and ports agree, and make-cert.sh makes
a certificate the API server would accept for the Service."""

from __future__ import annotations

import base64
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
    assert (
        "kubectl -n kernelbake-system create secret generic kernelbake-admission-tls --type=kubernetes.io/tls"
        in done.stdout
    )
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


def _container(docs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    (container,) = docs["Deployment/kernelbake-admission"]["spec"]["template"]["spec"]["containers"]
    return container


def test_the_probes_go_to_their_own_port_which_the_service_does_not_expose(
    docs: dict[str, dict[str, Any]],
) -> None:
    # Issue 41 item 2: on the webhooks' port, held connections failed every probe.
    container = _container(docs)
    args = dict(a.split("=", 1) for a in container["args"][1:])
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports["health"] == int(args["--health-port"]) != int(args["--port"])
    for probe, path in (("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")):
        get = container[probe]["httpGet"]
        assert (get["path"], get["port"], get["scheme"]) == (path, "health", "HTTP"), probe
        assert container[probe]["timeoutSeconds"] >= 2
    assert [p["targetPort"] for p in docs["Service/kernelbake-admission"]["spec"]["ports"]] == ["https"]


def test_the_network_policy_admits_the_webhooks_port_alone(docs: dict[str, dict[str, Any]]) -> None:
    policy = docs["NetworkPolicy/kernelbake-admission"]
    deployment = docs["Deployment/kernelbake-admission"]
    assert policy["metadata"]["namespace"] == deployment["metadata"]["namespace"]
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= labels.items()
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    https = next(p["containerPort"] for p in _container(docs)["ports"] if p["name"] == "https")
    assert [port for rule in policy["spec"]["ingress"] for port in rule["ports"]] == [
        {"protocol": "TCP", "port": https}
    ]


def test_the_webhook_has_a_priority_class_of_its_own(docs: dict[str, dict[str, Any]]) -> None:
    pod = docs["Deployment/kernelbake-admission"]["spec"]["template"]["spec"]
    priority = docs[f"PriorityClass/{pod['priorityClassName']}"]
    # Above ordinary workloads, at most what a user-defined class may have.
    assert 0 < priority["value"] <= 1_000_000_000 and priority["globalDefault"] is False


def test_the_deployment_serves_only_the_api_servers_certificate_from_the_secret_make_cert_fills(
    docs: dict[str, dict[str, Any]], tmp_path: Path
) -> None:
    # Issue 41: without --client-ca the webhook served any client that reached its port.
    container = _container(docs)
    args = dict(a.split("=", 1) for a in container["args"][1:] if "=" in a)
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert args["--client-ca"] == f"{mounts['tls']}/ca.crt"
    assert "--unsafe-any-client" not in container["args"]
    done = subprocess.run(
        [str(DEPLOY / "make-cert.sh"), "--out", str(tmp_path)], capture_output=True, text=True, check=True
    )
    assert f"--from-file=ca.crt={tmp_path}/ca.crt" in done.stdout


def test_make_cert_deletes_the_ca_key_and_makes_the_api_servers_client_certificate(tmp_path: Path) -> None:
    # The CA key left on disk let whoever read it mint certificates the webhooks trust.
    done = subprocess.run(
        [str(DEPLOY / "make-cert.sh"), "--out", str(tmp_path / "a")],
        capture_output=True,
        text=True,
        check=True,
    )
    out = tmp_path / "a"
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*")) == [
        "apiserver",
        "apiserver/admission-configuration.yaml",
        "apiserver/kubeconfig.yaml",
        "ca.crt",
        "client.crt",
        "client.key",
        "tls.crt",
        "tls.key",
    ]
    assert "90 days" in done.stdout
    for secret in ("client.key", "tls.key", "apiserver/kubeconfig.yaml"):
        assert (out / secret).stat().st_mode & 0o077 == 0, secret

    def verify(cert: str, purpose: str) -> int:
        return subprocess.run(
            ["openssl", "verify", "-CAfile", str(out / "ca.crt"), "-purpose", purpose, str(out / cert)],
            capture_output=True,
        ).returncode

    assert verify("client.crt", "sslclient") == 0
    # Each certificate for its side alone.
    assert verify("client.crt", "sslserver") != 0 and verify("tls.crt", "sslclient") != 0
    assert "CN = kube-apiserver" in _subject(out / "client.crt")
    subprocess.run(
        [str(DEPLOY / "make-cert.sh"), "--out", str(tmp_path / "b"), "--keep-ca-key", "--client", "api"],
        capture_output=True,
        check=True,
    )
    assert (tmp_path / "b" / "ca.key").stat().st_mode & 0o077 == 0
    assert "CN = api" in _subject(tmp_path / "b" / "client.crt")


def test_make_cert_out_certs_in_a_checkout_leaves_no_key_git_would_commit(tmp_path: Path) -> None:
    # Issue 44: `make-cert.sh --out certs`, run from the checkout as a reader might, wrote a CA
    # private key where a `git add -A` took it. The CA key is kept here on purpose: even then.
    subprocess.run(
        [str(DEPLOY / "make-cert.sh"), "--out", "certs", "--keep-ca-key"],
        cwd=tmp_path,
        capture_output=True,
        check=True,
    )
    wrote = sorted(str(p.relative_to(tmp_path)) for p in (tmp_path / "certs").rglob("*") if p.is_file())
    assert "certs/ca.key" in wrote and "certs/tls.key" in wrote, wrote
    # Asked of this repository's .gitignore, as if those files lay in its root.
    done = subprocess.run(
        ["git", "-C", str(REPO), "check-ignore", "--no-index", "--stdin"],
        input="\n".join(wrote) + "\n",
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode in (0, 1), done.stderr  # 1: none ignored
    assert sorted(set(wrote) - set(done.stdout.splitlines())) == []


def _subject(cert: Path) -> str:
    return subprocess.run(
        ["openssl", "x509", "-noout", "-subject", "-in", str(cert)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout


def test_make_cert_writes_the_api_servers_admission_configuration_for_the_webhooks_service(
    docs: dict[str, dict[str, Any]], tmp_path: Path
) -> None:
    subprocess.run(
        [str(DEPLOY / "make-cert.sh"), "--out", str(tmp_path), "--apiserver-dir", "/etc/kb"],
        capture_output=True,
        check=True,
    )
    config = yaml.safe_load((tmp_path / "apiserver" / "admission-configuration.yaml").read_text())
    assert config["kind"] == "AdmissionConfiguration"
    plugins = {p["name"]: p["configuration"] for p in config["plugins"]}
    assert plugins.keys() == {"ValidatingAdmissionWebhook", "MutatingAdmissionWebhook"}
    assert {c["kubeConfigFile"] for c in plugins.values()} == {"/etc/kb/kubeconfig.yaml"}
    kubeconfig = yaml.safe_load((tmp_path / "apiserver" / "kubeconfig.yaml").read_text())
    (user,) = kubeconfig["users"]
    # The API server picks the credentials by the host it calls: <service>.<namespace>.svc,
    # on port 443 (else host:port), for both webhooks.
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        (hook,) = docs[f"{kind}/kernelbake-admission"]["webhooks"]
        service = hook["clientConfig"]["service"]
        assert service["port"] == 443
        assert user["name"] == f"{service['name']}.{service['namespace']}.svc"
    assert base64.b64decode(user["user"]["client-certificate-data"]) == (tmp_path / "client.crt").read_bytes()
    assert base64.b64decode(user["user"]["client-key-data"]) == (tmp_path / "client.key").read_bytes()
