"""deploy/: the Kubernetes manifests, the one-host gateway script and the Containerfile agree with Bubo and smg.

No cluster and no image build here (docs/deploy.md says what was run where):
each kustomization is rendered by ``kubectl kustomize`` (kubectl must be on
PATH: the test fails without it), every object it renders is checked against
Kubernetes 1.32's JSON schema (kubernetes-validate, strict: an unknown field
fails), and the wiring a typo would break is checked here: Bubo's arguments
through Bubo's own parser, smg's through smg's.  The nginx config is exercised
for real in tests/e2e/test_load_balancer.py, the gateway in ``nox -s gateway``.
"""

from __future__ import annotations

import argparse
import importlib.util
import re
import shutil
import subprocess
from pathlib import Path
from types import ModuleType
from typing import Any

import kubernetes_validate
import pytest
import yaml
from smg.router_args import RouterArgs

from bubo.cli import FLUSH_AFTER_DRAIN_S, _parser
from bubo.config import Settings, flag_values, load_settings
from bubo.server import INTERRUPT_WAIT_S

DEPLOY = Path(__file__).parents[1] / "deploy"
KUSTOMIZATIONS = ("k8s", "k8s/ingress-nginx")  # smg in front (the default), ingress-nginx (the simple one)
KUBERNETES_VERSION = "1.32"  # the kubectl here; the manifests use nothing newer


def render(kustomization: str) -> dict[tuple[str, str], dict[str, Any]]:
    """What ``kubectl kustomize deploy/<kustomization>`` renders, by (kind, name)."""
    kubectl = shutil.which("kubectl")
    assert kubectl, "kubectl (with its built-in kustomize) is needed to render deploy/k8s"
    text = subprocess.run(
        [kubectl, "kustomize", str(DEPLOY / kustomization)], check=True, capture_output=True, text=True
    ).stdout
    objects = {(o["kind"], o["metadata"]["name"]): o for o in yaml.safe_load_all(text)}
    assert len(objects) == text.count("\nkind: ") + text.startswith("kind: ")  # no two share a name
    return objects


@pytest.fixture(name="k8s", scope="module")
def _k8s() -> dict[tuple[str, str], dict[str, Any]]:
    return render("k8s")


@pytest.fixture(name="ingress", scope="module")
def _ingress() -> dict[tuple[str, str], dict[str, Any]]:
    return render("k8s/ingress-nginx")


def only(k8s: dict[tuple[str, str], dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    return k8s[kind, name]


def container(deployment: dict[str, Any]) -> dict[str, Any]:
    (first,) = deployment["spec"]["template"]["spec"]["containers"]
    return first


def serve_settings(args: list[str]) -> Settings:
    """What `bubo` makes of a command line's arguments (with no BUBO_* variable set)."""
    parsed = _parser().parse_args(args)
    assert parsed.command == "serve"
    return load_settings(flag_values(parsed), environ={})


def smg_args(args: list[str]) -> RouterArgs:
    """What `smg launch` makes of its arguments, validated as smg validates them before it starts."""
    parser = argparse.ArgumentParser(exit_on_error=False)
    RouterArgs.add_cli_args(parser)
    router = RouterArgs.from_cli_args(parser.parse_args(args))
    router._validate_router_args()
    return router


def probe_path(probe: dict[str, Any]) -> str:
    """The route an exec probe asks for (its last argument), on the port Bubo listens on."""
    command = probe["exec"]["command"]
    assert command[:2] == ["python", "-c"]
    assert "'http://127.0.0.1:8080' + sys.argv[1]" in command[2]
    return str(command[3])


def gateway_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gateway_run", DEPLOY / "gateway" / "run.py")
    assert spec
    assert spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_every_rendered_object_passes_the_kubernetes_schema(kustomization: str) -> None:
    """Strict: a misspelled or misplaced field fails, as a type or a missing required one does."""
    for key, document in render(kustomization).items():
        assert kubernetes_validate.validate(document, KUBERNETES_VERSION, strict=True), key


def test_the_schema_check_catches_a_misspelled_field(k8s: dict[tuple[str, str], dict[str, Any]]) -> None:
    deployment = only(k8s, "Deployment", "bubo")
    wrong = {**deployment, "spec": {**deployment["spec"], "replica": 3}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(wrong, KUBERNETES_VERSION, strict=True)


def test_each_option_renders_what_it_needs(
    k8s: dict[tuple[str, str], dict[str, Any]], ingress: dict[tuple[str, str], dict[str, Any]]
) -> None:
    assert set(k8s) == {
        ("Deployment", "bubo"),
        ("Deployment", "smg"),
        ("Service", "smg"),
        ("Deployment", "smg-responses"),
        ("Service", "smg-responses"),
        ("ServiceAccount", "smg"),
        ("Role", "smg-pod-discovery"),
        ("RoleBinding", "smg-pod-discovery"),
    }
    assert set(ingress) == {("Deployment", "bubo"), ("Service", "bubo"), ("Ingress", "bubo")}
    assert ingress["Deployment", "bubo"] == k8s["Deployment", "bubo"]  # the same replicas either way


def test_the_container_serves_what_its_probes_and_port_ask(
    k8s: dict[tuple[str, str], dict[str, Any]],
) -> None:
    bubo = container(only(k8s, "Deployment", "bubo"))
    settings = serve_settings(bubo["args"]).server
    assert settings.hosts == ("0.0.0.0",)  # reachable from the pod network
    assert bubo["ports"] == [{"name": "http", "containerPort": settings.port}]
    assert probe_path(bubo["readinessProbe"]) == "/ready"
    assert probe_path(bubo["livenessProbe"]) == "/health"
    assert {e["name"] for e in bubo["env"]} <= {"BUBO_THREADS", "BUBO_API_KEY"}


def test_the_grace_period_covers_the_pre_stop_pause_the_drain_and_the_exit(
    k8s: dict[tuple[str, str], dict[str, Any]],
) -> None:
    """preStop pause + drain delay + drain + the wait for interrupted streams + hypercorn's flush, before SIGKILL."""
    deployment = only(k8s, "Deployment", "bubo")
    bubo = container(deployment)
    pause = bubo["lifecycle"]["preStop"]["exec"]["command"]
    assert pause[0] == "sleep"
    server = serve_settings(bubo["args"]).server
    shutdown = (
        float(pause[1])
        + server.drain_delay
        + server.shutdown_timeout
        + INTERRUPT_WAIT_S
        + FLUSH_AFTER_DRAIN_S
    )
    assert deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] > shutdown


def test_smg_discovers_the_bubo_pods_by_label_on_their_port(
    k8s: dict[tuple[str, str], dict[str, Any]],
) -> None:
    """--service-discovery with a selector that matches the pods, in smg's own namespace, on Bubo's port."""
    bubo_pods = only(k8s, "Deployment", "bubo")["spec"]["template"]["metadata"]["labels"]
    smg_deployment = only(k8s, "Deployment", "smg")
    smg = container(smg_deployment)
    args = smg_args(smg["args"])
    assert args.service_discovery
    assert args.selector.items() <= bubo_pods.items()
    assert args.selector  # an empty selector would discover nothing (smg warns and skips every pod)
    assert (
        only(k8s, "Deployment", "smg")["spec"]["template"]["metadata"]["labels"].items() != bubo_pods.items()
    )
    bubo_port = serve_settings(container(only(k8s, "Deployment", "bubo"))["args"]).server.port
    assert args.service_discovery_port == bubo_port
    assert args.service_discovery_namespace == "$(POD_NAMESPACE)"  # expanded by the kubelet from:
    (namespace,) = smg["env"]
    assert namespace == {
        "name": "POD_NAMESPACE",
        "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}},
    }
    assert args.policy == "cache_aware"
    assert args.health_check_endpoint == "/ready"  # a draining or loading replica is alive, not ready
    assert smg_deployment["spec"]["replicas"] == 1  # cache_aware's prefix tree lives in one process
    (port,) = only(k8s, "Service", "smg")["spec"]["ports"]
    assert (port["targetPort"], args.port) == (
        "http",
        next(p for p in smg["ports"] if p["name"] == "http")["containerPort"],
    )
    assert (
        only(k8s, "Service", "smg")["spec"]["selector"].items()
        <= smg_deployment["spec"]["template"]["metadata"]["labels"].items()
    )


def test_the_responses_front_keeps_the_history_and_sends_to_the_gateway_s_service(
    k8s: dict[tuple[str, str], dict[str, Any]],
) -> None:
    """smg-responses: --backend openai with its own store; its one worker is the smg Service's address."""
    deployment = only(k8s, "Deployment", "smg-responses")
    front = smg_args(container(deployment)["args"])
    assert (front.backend, front.history_backend) == ("openai", "memory")
    gateway = only(k8s, "Service", "smg")
    (port,) = gateway["spec"]["ports"]
    assert front.worker_urls == [f"http://{gateway['metadata']['name']}:{port['port']}"]
    assert deployment["spec"]["replicas"] == 1  # the memory store is one process's
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert only(k8s, "Service", "smg-responses")["spec"]["selector"].items() <= labels.items()
    assert not gateway["spec"]["selector"].items() <= labels.items()  # not one of the gateway's pods


def test_smg_may_read_the_pods_of_its_namespace_and_nothing_more(
    k8s: dict[tuple[str, str], dict[str, Any]],
) -> None:
    spec = only(k8s, "Deployment", "smg")["spec"]["template"]["spec"]
    account = only(k8s, "ServiceAccount", spec["serviceAccountName"])["metadata"]["name"]
    binding = only(k8s, "RoleBinding", "smg-pod-discovery")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account}]
    assert binding["roleRef"]["kind"] == "Role"  # namespaced, not a ClusterRole
    role = only(k8s, "Role", binding["roleRef"]["name"])
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}]


def test_the_one_host_script_runs_replicas_that_drain_behind_smg() -> None:
    """deploy/gateway/run.py: each command as bubo and smg read it; the drain outlasts smg's detection."""
    script = gateway_script()
    replicas = 3
    *serves, gateway = script.commands(
        script.parser().parse_args(["--replicas", str(replicas), "--", "-t", "1"])
    )
    assert len(serves) == replicas
    ports = []
    for command in serves:
        assert command[0] == "bubo"
        settings = serve_settings(command[1:])
        assert settings.server.hosts == ("127.0.0.1",)
        assert settings.model.threads == 1  # the flags after -- reach every replica
        ports.append(settings.server.port)
        assert settings.server.drain_delay == script.DRAIN_DELAY_S
    assert gateway[:2] == ["smg", "launch"]
    args = smg_args(gateway[2:])
    assert args.worker_urls == [f"http://127.0.0.1:{port}" for port in ports]
    assert args.port not in ports
    assert args.policy == "cache_aware"
    assert args.health_check_endpoint == "/ready"
    detection = args.health_failure_threshold * args.health_check_interval_secs
    assert detection < script.DRAIN_DELAY_S  # smg stops sending before the replica stops accepting
    assert args.host == args.prometheus_host == "127.0.0.1"


def test_the_one_host_script_s_responses_front_keeps_the_history_before_the_gateway() -> None:
    """--responses-port: smg --backend openai with its own store, whose one worker is the gateway."""
    script = gateway_script()
    *_, gateway, front = script.commands(
        script.parser().parse_args(["--replicas", "2", "--responses-port", "8090"])
    )
    inner, outer = smg_args(gateway[2:]), smg_args(front[2:])
    assert (outer.backend, outer.history_backend) == ("openai", "memory")
    assert outer.worker_urls == [f"http://127.0.0.1:{inner.port}"]
    assert len({inner.port, outer.port, inner.prometheus_port, outer.prometheus_port}) == 4
    assert outer.host == outer.prometheus_host == "127.0.0.1"


def test_the_service_and_ingress_reach_the_pods(ingress: dict[tuple[str, str], dict[str, Any]]) -> None:
    deployment = only(ingress, "Deployment", "bubo")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
    service = only(ingress, "Service", "bubo")
    assert service["spec"]["selector"].items() <= labels.items()
    (port,) = service["spec"]["ports"]
    assert port["targetPort"] == "http"
    (rule,) = only(ingress, "Ingress", "bubo")["spec"]["rules"]
    (path,) = rule["http"]["paths"]
    assert path["backend"]["service"] == {"name": service["metadata"]["name"], "port": {"name": port["name"]}}


def test_ingress_and_nginx_config_hash_the_same_header_and_allow_the_same_body(
    ingress: dict[tuple[str, str], dict[str, Any]],
) -> None:
    annotations = only(ingress, "Ingress", "bubo")["metadata"]["annotations"]
    nginx = (DEPLOY / "nginx" / "bubo.conf").read_text()
    assert annotations["nginx.ingress.kubernetes.io/upstream-hash-by"] == "$http_x_conversation_id"
    assert "map $http_x_conversation_id $bubo_affinity" in nginx
    assert "hash $bubo_affinity consistent;" in nginx
    body_limit = f"{load_settings({}, environ={}).server.max_body_mib}m"
    assert annotations["nginx.ingress.kubernetes.io/proxy-body-size"] == body_limit
    assert f"client_max_body_size {body_limit};" in nginx
    retry = re.search(r"^\s*proxy_next_upstream (.*);$", nginx, re.MULTILINE)
    assert retry
    assert annotations["nginx.ingress.kubernetes.io/proxy-next-upstream"] == retry.group(1)


def test_one_busy_answer_does_not_take_a_replica_out() -> None:
    """A 503 queue_full counts as a failed attempt (http_503 is retried), so max_fails must exceed one."""
    nginx = (DEPLOY / "nginx" / "bubo.conf").read_text()
    assert "http_503" in re.findall(r"^\s*proxy_next_upstream (.*);$", nginx, re.MULTILINE)[0].split()
    servers = re.findall(r"^\s*server \S+ max_fails=(\d+) fail_timeout=(\d+)s;$", nginx, re.MULTILINE)
    assert len(servers) == 2
    for max_fails, fail_timeout in servers:
        assert int(max_fails) >= 3
        assert int(fail_timeout) >= 10


def test_the_image_runs_bubo_serve_as_a_user_with_a_health_check() -> None:
    lines = (DEPLOY / "Containerfile").read_text().splitlines()
    instructions = [line for line in lines if line and not line.startswith((" ", "#"))]
    final = instructions[max(i for i, line in enumerate(instructions) if line.startswith("FROM "))]
    assert final == "FROM ${PYTHON_IMAGE}"  # the runtime stage, without the compilers
    assert "USER 10001:10001" in instructions
    assert "EXPOSE 8080" in instructions
    assert 'ENTRYPOINT ["bubo"]' in instructions
    assert 'CMD ["serve", "--host", "0.0.0.0"]' in instructions
    assert any(line.startswith("HEALTHCHECK ") for line in instructions)
    assert "'/health'" in "\n".join(lines)
