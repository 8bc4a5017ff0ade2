"""deploy/: the Kubernetes manifests and the Containerfile agree with each other and with Bubo.

No cluster and no image build here (docs/deploy.md says what was run where): the
manifests are parsed with PyYAML and checked for the wiring a typo would break.
The nginx config is exercised for real in tests/e2e/test_load_balancer.py.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from bubo.cli import FLUSH_AFTER_DRAIN_S, _parser
from bubo.config import Settings, flag_values, load_settings
from bubo.server import INTERRUPT_WAIT_S

DEPLOY = Path(__file__).parents[1] / "deploy"


def manifests() -> dict[str, dict[str, Any]]:
    """Every object in deploy/k8s by kind (one of each)."""
    found: dict[str, dict[str, Any]] = {}
    for path in sorted((DEPLOY / "k8s").glob("*.yaml")):
        for document in yaml.safe_load_all(path.read_text()):
            assert document["kind"] not in found, path
            found[document["kind"]] = document
    return found


@pytest.fixture(name="k8s", scope="module")
def _k8s() -> dict[str, dict[str, Any]]:
    return manifests()


def container(k8s: dict[str, dict[str, Any]]) -> dict[str, Any]:
    (bubo,) = k8s["Deployment"]["spec"]["template"]["spec"]["containers"]
    return bubo


def serve_settings(args: list[str]) -> Settings:
    """What `bubo` makes of the container's arguments (with no BUBO_* variable set)."""
    parsed = _parser().parse_args(args)
    assert parsed.command == "serve"
    return load_settings(flag_values(parsed), environ={})


def probe_path(probe: dict[str, Any]) -> str:
    """The route an exec probe asks for (its last argument), on the port Bubo listens on."""
    command = probe["exec"]["command"]
    assert command[:2] == ["python", "-c"]
    assert "'http://127.0.0.1:8080' + sys.argv[1]" in command[2]
    return str(command[3])


def test_kustomization_lists_every_manifest(k8s: dict[str, dict[str, Any]]) -> None:
    listed = set(k8s["Kustomization"]["resources"])
    assert listed == {p.name for p in (DEPLOY / "k8s").glob("*.yaml")} - {"kustomization.yaml"}


def test_the_container_serves_what_its_probes_and_port_ask(k8s: dict[str, dict[str, Any]]) -> None:
    bubo = container(k8s)
    settings = serve_settings(bubo["args"]).server
    assert settings.hosts == ("0.0.0.0",)  # reachable from the pod network
    assert bubo["ports"] == [{"name": "http", "containerPort": settings.port}]
    assert probe_path(bubo["readinessProbe"]) == "/ready"
    assert probe_path(bubo["livenessProbe"]) == "/health"
    assert {e["name"] for e in bubo["env"]} <= {"BUBO_THREADS", "BUBO_API_KEY"}


def test_the_grace_period_covers_the_pre_stop_pause_the_drain_and_the_exit(
    k8s: dict[str, dict[str, Any]],
) -> None:
    """preStop pause + drain + the wait for interrupted streams + hypercorn's flush, before SIGKILL."""
    spec = k8s["Deployment"]["spec"]["template"]["spec"]
    bubo = container(k8s)
    pause = bubo["lifecycle"]["preStop"]["exec"]["command"]
    assert pause[0] == "sleep"
    drain = serve_settings(bubo["args"]).server.shutdown_timeout
    shutdown = float(pause[1]) + drain + INTERRUPT_WAIT_S + FLUSH_AFTER_DRAIN_S
    assert spec["terminationGracePeriodSeconds"] > shutdown


def test_the_service_and_ingress_reach_the_pods(k8s: dict[str, dict[str, Any]]) -> None:
    labels = k8s["Deployment"]["spec"]["template"]["metadata"]["labels"]
    assert k8s["Deployment"]["spec"]["selector"]["matchLabels"].items() <= labels.items()
    service = k8s["Service"]
    assert service["spec"]["selector"].items() <= labels.items()
    (port,) = service["spec"]["ports"]
    assert port["targetPort"] == "http"
    (rule,) = k8s["Ingress"]["spec"]["rules"]
    (path,) = rule["http"]["paths"]
    assert path["backend"]["service"] == {"name": service["metadata"]["name"], "port": {"name": port["name"]}}


def test_ingress_and_nginx_config_hash_the_same_header_and_allow_the_same_body() -> None:
    annotations = manifests()["Ingress"]["metadata"]["annotations"]
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
