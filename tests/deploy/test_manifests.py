"""deploy/k8s without a cluster: every manifest against the Kubernetes JSON schemas (kubernetes-validate,
schemas shipped in the package, strict: unknown fields fail), the ServiceMonitor CRD by shape, the
ConfigMaps against routes/ and policies/ (no drift, `gateway policy check` passes), and the wiring
between the objects (names, selectors, mounted files, vLLM pods the routes file points at)."""

from __future__ import annotations

import copy
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import kubernetes_validate
import pytest
import yaml

from gateway.config import load_config

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
KUBERNETES_VERSION = "1.33"
CRDS = {("monitoring.coreos.com/v1", "ServiceMonitor")}  # no schema in the package: checked by shape below
Manifest = dict[str, Any]


def manifests() -> list[Manifest]:
    """Every object the kustomization applies."""
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    return [doc for name in kustomization["resources"] for doc in yaml.safe_load_all((K8S / name).read_text()) if doc]


def find(kind: str, name: str | None = None) -> list[Manifest]:
    return [m for m in manifests() if m["kind"] == kind and (name is None or m["metadata"]["name"] == name)]


def one(kind: str, name: str) -> Manifest:
    (found,) = find(kind, name)
    return found


def container(workload: Manifest) -> Manifest:
    (first,) = workload["spec"]["template"]["spec"]["containers"]
    return dict(first)


def flag(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


def test_the_kustomization_lists_every_manifest_file() -> None:
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    on_disk = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert sorted(kustomization["resources"]) == sorted(on_disk)


# CRDs have no schema in the package: checked by test_service_monitors_select_services_and_their_ports
@pytest.mark.parametrize("doc", [m for m in manifests() if (m["apiVersion"], m["kind"]) not in CRDS],
                         ids=lambda m: f"{m['kind']}/{m['metadata']['name']}")
def test_each_manifest_is_valid_for_kubernetes(doc: Manifest) -> None:
    assert kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True) == KUBERNETES_VERSION


def test_the_validator_refuses_broken_manifests() -> None:
    deployment = one("Deployment", "gateway")
    typo = copy.deepcopy(deployment)
    typo["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {"httpGet": {"path": "/readyz"}}
    wrong_type = copy.deepcopy(deployment)
    wrong_type["spec"]["replicas"] = "three"
    for broken in (typo, wrong_type):
        with pytest.raises(kubernetes_validate.ValidationError):
            kubernetes_validate.validate(broken, KUBERNETES_VERSION, strict=True)


def test_service_monitors_select_services_and_their_ports() -> None:
    services = find("Service")
    for monitor in find("ServiceMonitor"):
        assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
        wanted = monitor["spec"]["selector"]["matchLabels"]
        selected = [s for s in services if wanted.items() <= s["metadata"].get("labels", {}).items()]
        assert selected, f"ServiceMonitor {monitor['metadata']['name']} selects no Service"
        for endpoint in monitor["spec"]["endpoints"]:
            assert set(endpoint) <= {"port", "path", "interval", "scrapeTimeout", "authorization"}
            assert endpoint["path"] == "/metrics"
            assert all(endpoint["port"] in {p["name"] for p in s["spec"]["ports"]} for s in selected)


def test_prometheus_scrapes_the_gateway_with_the_metrics_key_the_gateway_reads() -> None:
    """Issue 37: the series naming tenants are served only with the metrics key: the gateway's ServiceMonitor
    sends, as a bearer token, the Secret key the gateway pods read as GATEWAY_METRICS_TOKEN."""
    (endpoint,) = one("ServiceMonitor", "gateway")["spec"]["endpoints"]
    authorization = endpoint["authorization"]
    assert authorization["type"] == "Bearer"
    secret, key = authorization["credentials"]["name"], authorization["credentials"]["key"]
    assert key in one("Secret", secret)["stringData"]
    (env,) = [e for e in container(one("Deployment", "gateway"))["env"] if e["name"] == "GATEWAY_METRICS_TOKEN"]
    assert env["valueFrom"]["secretKeyRef"] == {"name": secret, "key": key}


def test_the_configmaps_are_the_repository_files() -> None:
    rendered = subprocess.run([sys.executable, str(K8S / "configmaps.py"), "--check"], capture_output=True, text=True)
    assert rendered.returncode == 0, rendered.stderr
    for name, folder in (("gateway-routes", "routes"), ("gateway-policies", "policies")):
        for file, text in one("ConfigMap", name)["data"].items():
            assert text == (ROOT / folder / file).read_text(), f"{name}/{file} differs from {folder}/{file}"


def mounted_config(folder: Path) -> tuple[Path, Path]:
    """The ConfigMaps as the gateway pod sees them (a folder per mount); the paths its args name."""
    pod = one("Deployment", "gateway")["spec"]["template"]["spec"]
    mounts = {m["name"]: m["mountPath"] for m in container(one("Deployment", "gateway"))["volumeMounts"]}
    for volume in pod["volumes"]:
        if "configMap" in volume:
            target = folder / mounts[volume["name"]].lstrip("/")
            target.mkdir(parents=True)
            for file, text in one("ConfigMap", volume["configMap"]["name"])["data"].items():
                (target / file).write_text(text)
    args = container(one("Deployment", "gateway"))["args"]
    return folder / flag(args, "--routes").lstrip("/"), folder / flag(args, "--policies").lstrip("/")


def test_gateway_policy_check_passes_on_the_mounted_configmaps(tmp_path: Path) -> None:
    routes, policy = mounted_config(tmp_path)
    check = subprocess.run([sys.executable, "-m", "gateway", "policy", "check", str(routes), str(policy)],
                           capture_output=True, text=True, cwd=ROOT)
    assert check.returncode == 0, check.stdout + check.stderr
    assert set(load_config(routes, policy).tiers) == {"small-int4", "medium-int8", "large-fp16"}  # cross-checked


def test_the_gateway_deployment_is_wired() -> None:
    deployment, gateway = one("Deployment", "gateway"), container(one("Deployment", "gateway"))
    pod, labels = deployment["spec"]["template"]["spec"], deployment["spec"]["template"]["metadata"]["labels"]
    assert gateway["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert gateway["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert gateway["resources"]["requests"]["cpu"] and pod["securityContext"]["runAsNonRoot"]
    assert not any("subPath" in m for m in gateway["volumeMounts"])  # subPath mounts never see updates
    secret_refs = {e["valueFrom"]["secretKeyRef"]["name"]: e["valueFrom"]["secretKeyRef"]["key"]
                   for e in gateway["env"] if "secretKeyRef" in e.get("valueFrom", {})}
    for secret, key in secret_refs.items():
        assert key in one("Secret", secret)["stringData"]
    drain = float(flag(gateway["args"], "--drain-timeout"))
    assert pod["terminationGracePeriodSeconds"] > gateway["lifecycle"]["preStop"]["sleep"]["seconds"] + drain
    assert one("Service", "gateway")["spec"]["selector"].items() <= labels.items()
    assert one("PodDisruptionBudget", "gateway")["spec"]["selector"]["matchLabels"].items() <= labels.items()
    hpa = one("HorizontalPodAutoscaler", "gateway")["spec"]
    assert hpa["scaleTargetRef"]["name"] == "gateway" and hpa["minReplicas"] >= 2


def test_every_routes_replica_is_a_vllm_pod_with_prefix_caching(tmp_path: Path) -> None:
    routes, policy = mounted_config(tmp_path)
    for tier in load_config(routes, policy).tiers.values():
        for replica in tier.replicas:
            host = urlsplit(replica.url).hostname or ""
            pod, _, service = host.partition(".")  # <statefulset>-<ordinal>.<headless service>
            name, _, ordinal = pod.rpartition("-")
            statefulset = one("StatefulSet", name)
            assert statefulset["spec"]["serviceName"] == service and int(ordinal) < statefulset["spec"]["replicas"]
            assert one("Service", service)["spec"]["clusterIP"] == "None"
            vllm = container(statefulset)
            assert "--enable-prefix-caching" in vllm["args"]
            assert flag(vllm["args"], "--served-model-name") == replica.model
            assert int(flag(vllm["args"], "--max-model-len")) == tier.context_window
            assert int(vllm["resources"]["limits"]["nvidia.com/gpu"]) >= 1
            assert urlsplit(replica.url).port == vllm["ports"][0]["containerPort"]


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed: `make kubectl` installs "
                    "Debian's kubernetes-client (make test does; in CI this skip is a failure)")
def test_kubectl_kustomize_renders_the_same_objects() -> None:
    rendered = subprocess.run(["kubectl", "kustomize", str(K8S)], capture_output=True, text=True, check=True).stdout
    names = sorted((d["kind"], d["metadata"]["name"]) for d in yaml.safe_load_all(rendered) if d)
    assert names == sorted((m["kind"], m["metadata"]["name"]) for m in manifests())
