"""Offline checks of deploy/ (issue 21): no container runtime or Kubernetes runs here, so the
Dockerfile, the compose file and the Kubernetes manifests are checked as files. Every YAML
parses; the manifests pass the Kubernetes API's JSON schemas (kubernetes-validate, which ships
them); the compose file's references are consistent; the Dockerfile copies what exists and runs
real console scripts; and each broker's command line, the compose file's as written and each
StatefulSet pod's as rendered through the image's entrypoint script, is accepted by
``dledger-broker start``'s own parser and gives a consistent group (same peers everywhere,
each node's id among them, at the address where it really listens)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from collections import defaultdict
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from tests.ops.deploy_files import (
    COMPOSE,
    DEPLOY,
    DOCKERFILE,
    ENTRYPOINT_SCRIPT,
    K8S,
    ROOT,
    BrokerArgs,
    CommandFailed,
    compose_interpolate,
    console_scripts,
    dockerfile_instructions,
    dockerignore_patterns,
    ignored_by,
    instruction_words,
    k8s_documents,
    k8s_expand,
    k8s_objects,
    load_compose,
    package_patterns,
    parse_broker_command,
    parse_namesrv_command,
    pod_environment,
    published_ports,
    record_command,
)

NAMESPACE = "prod-mq"  # any namespace: the rendered names must follow it
K8S_VERSIONS = ("1.27.0", kubernetes_validate.latest_version())
PORTS = {"namesrv": 9876, "client": 10911, "peer": 20911, "admin": 8080, "grpc": 8081}


def _copied_programs() -> dict[str, Path]:
    """Program name -> repository file, for each file the Dockerfile copies into a bin folder."""
    out = {}
    for word, args in dockerfile_instructions():
        if word == "COPY":
            *sources, dest = instruction_words(args)
            if "/bin/" in dest and len(sources) == 1:
                out[Path(dest).name] = ROOT / sources[0]
    return out


# --- YAML and the Dockerfile ---------------------------------------------------------------------

def test_every_yaml_file_in_deploy_parses() -> None:
    files = sorted(DEPLOY.rglob("*.yaml")) + sorted(DEPLOY.rglob("*.yml"))
    assert COMPOSE in files and len(list(K8S.glob("*.yaml"))) >= 3
    for path in files:
        docs = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
        assert docs and all(isinstance(d, dict) for d in docs), path


def test_the_dockerfile_copies_what_exists_and_installs_every_package() -> None:
    steps = dockerfile_instructions()
    # the base is a build argument (deploy/build-image.sh gives its own), by default Python's
    assert steps[0] == ("ARG", "BASE_IMAGE=python:3.11-slim")
    assert steps[1] == ("FROM", "${BASE_IMAGE}")
    ignore = dockerignore_patterns()
    copied = []
    for word, args in steps:
        if word in ("COPY", "ADD"):
            *sources, _ = instruction_words(args)
            for src in sources:
                assert (ROOT / src).exists(), f"{word} {src}: no such path in the build context"
                assert ignored_by(ignore, src) is None, \
                    f"{word} {src}: .dockerignore's {ignored_by(ignore, src)!r} keeps it out"
                copied.append(src.rstrip("/"))
    # pip install . needs pyproject's readme and every package setuptools is told to find
    assert {"pyproject.toml", "README.md"} <= set(copied)
    packages = {p.name for p in ROOT.iterdir() if (p / "__init__.py").exists()}
    wanted = {p for p in packages if any(p == pat.rstrip("*") for pat in package_patterns())}
    assert wanted and wanted <= set(copied), f"packages not copied: {sorted(wanted - set(copied))}"
    assert any(w == "RUN" and "pip install ." in a for w, a in steps)
    # the tests, docs and VCS data stay out of the context
    for kept_out in (".git", "tests", "docs", ".venv"):
        assert ignored_by(ignore, kept_out), kept_out


@pytest.mark.slow
def test_what_the_dockerfile_copies_builds_a_wheel_with_every_package_and_script(
        tmp_path: Path) -> None:
    """Stage exactly what the Dockerfile copies before `pip install .` and build the wheel from
    it (without the network: the venv's setuptools), as the image build would."""
    stage = tmp_path / "src"
    stage.mkdir()
    for word, args in dockerfile_instructions():
        if word == "RUN" and "pip install ." in args:
            break
        if word == "COPY":
            *sources, dest = instruction_words(args)
            assert not dest.startswith("/"), f"COPY to {dest} before pip install: into WORKDIR"
            for src in sources:
                target = stage / dest / Path(src).name if dest.endswith("/") else stage / dest
                copy = shutil.copytree if (ROOT / src).is_dir() else shutil.copy
                copy(ROOT / src, target)
    else:
        pytest.fail("the Dockerfile never runs `pip install .`")
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                           "-q", "-w", str(tmp_path / "out"), "."], cwd=stage, capture_output=True,
                          text=True, timeout=240, check=False)
    assert done.returncode == 0, done.stderr
    (wheel,) = (tmp_path / "out").glob("dledger-*.whl")
    with zipfile.ZipFile(wheel) as z:
        tops = {n.split("/")[0] for n in z.namelist()}
        entry_points = next(z.read(n).decode() for n in z.namelist() if n.endswith("entry_points.txt"))
    assert {"dledger", "broker", "namesrv", "client", "cli", "chaos"} <= tops
    for script, target in console_scripts().items():
        assert f"{script} = {target}" in entry_points


def test_the_image_runs_unprivileged_with_a_data_volume_and_the_ports() -> None:
    steps = dockerfile_instructions()
    users = [a for w, a in steps if w == "USER"]
    assert users and users[-1].split(":")[0] not in ("root", "0")
    assert ["/data"] in [instruction_words(a) for w, a in steps if w == "VOLUME"]
    exposed = {int(p) for w, a in steps if w == "EXPOSE" for p in a.split()}
    assert set(PORTS.values()) <= exposed
    cmd = instruction_words([a for w, a in steps if w == "CMD"][-1])
    assert not [a for w, a in steps if w == "ENTRYPOINT"], "the command alone picks the role"
    assert cmd[0] in console_scripts()
    assert parse_namesrv_command(cmd) == ("0.0.0.0", PORTS["namesrv"])


def test_every_program_the_deployments_run_is_in_the_image() -> None:
    in_image = set(console_scripts()) | set(_copied_programs())
    assert "dledger-statefulset-broker" in _copied_programs()
    commands = [s["command"] for s in load_compose()["services"].values()]
    for _, doc in k8s_documents():
        spec = doc.get("spec", {}).get("template", {}).get("spec", {})
        commands += [c["command"] for c in spec.get("containers", [])]
    assert commands
    for command in commands:
        assert command[0] in in_image, f"{command[0]}: not a console script nor copied in"


# --- compose -------------------------------------------------------------------------------------

def _broker_services(compose: dict[str, Any]) -> dict[str, BrokerArgs]:
    return {name: parse_broker_command(s["command"]) for name, s in compose["services"].items()
            if s["command"][0] == "dledger-broker"}


def test_compose_references_are_consistent() -> None:
    compose = load_compose()
    services, volumes = compose["services"], compose["volumes"]
    assert {s["image"] for s in services.values()} == {"dledger:local"}
    for name, s in services.items():
        build = s["build"]
        assert (COMPOSE.parent / build["context"]).resolve() == ROOT
        assert (ROOT / build["dockerfile"]).resolve() == DOCKERFILE
        for dep, how in s.get("depends_on", {}).items():
            assert dep in services, f"{name} depends on {dep}, which is not a service"
            if how.get("condition") == "service_healthy":
                assert "healthcheck" in services[dep], f"{name} waits for {dep}'s health: none"
    used: dict[str, str] = {}
    for name, s in services.items():
        for mount in s.get("volumes", []):
            vol, _, _path = mount.partition(":")
            assert vol in volumes, f"{name} mounts {vol}, which is not declared"
            assert vol not in used, f"{vol} is mounted by {used[vol]} and {name}"
            used[vol] = name
    assert set(used) == set(volumes), f"declared, never mounted: {sorted(set(volumes) - set(used))}"
    host_ports = [h for s in services.values() for h, _ in published_ports(s)]
    assert len(host_ports) == len(set(host_ports)), f"a host port published twice: {host_ports}"


def test_compose_runs_two_groups_of_three_whose_commands_the_broker_accepts() -> None:
    compose = load_compose()
    services = compose["services"]
    brokers = _broker_services(compose)
    groups: dict[str, dict[str, BrokerArgs]] = defaultdict(dict)
    for name, b in brokers.items():
        groups[b.node.group][name] = b
    assert sorted(groups) == ["a", "b"] and all(len(g) == 3 for g in groups.values())
    namesrvs = {name: parse_namesrv_command(s["command"]) for name, s in services.items()
                if s["command"][0] == "dledger-namesrv"}
    assert list(namesrvs) == ["namesrv"]
    for group, members in groups.items():
        peer_lists = {tuple(sorted(b.node.peers.items())) for b in members.values()}
        assert len(peer_lists) == 1, f"group {group}: the members disagree on --peers"
        peers = members[next(iter(members))].node.peers
        assert sorted(b.node.node_id for b in members.values()) == sorted(peers)
        for name, b in members.items():
            s = services[name]
            # its peer address is its own stable name: the others reach it there, it binds it
            assert peers[b.node.node_id] == (name, PORTS["peer"]) and s["hostname"] == name
            mounts = [m.partition(":")[2] for m in s["volumes"]]
            assert any(Path(b.node.data_dir).is_relative_to(m) for m in mounts), \
                f"{name}: --data-dir {b.node.data_dir} is not on its volume"
            assert all(ns.rpartition(":")[0] in namesrvs for ns in b.namesrv)
            assert {ns.rpartition(":")[2] for ns in b.namesrv} == {str(PORTS["namesrv"])}
            _check_compose_ports(name, s, b)


def _check_compose_ports(name: str, s: dict[str, Any], b: BrokerArgs) -> None:
    published = dict(published_ports(s))
    # a registered address is HOST:the port the node listens on, so each is published 1:1
    assert all(h == c for h, c in published.items()), f"{name}: published to another port"
    assert b.advertise == ("127.0.0.1", b.listen[1]) and b.listen[1] in published
    assert b.grpc is not None and b.grpc[1] in published
    # admin HTTP is published too (dledger status from the host) and registered at the
    # advertised host; the health check asks it inside the container
    assert b.admin[0] == "0.0.0.0" and b.admin[1] in published
    assert b.params["admin_advertise"] is None
    test = s["healthcheck"]["test"]
    assert test[:3] == ["CMD", "python", "-c"]
    assert f"'http://127.0.0.1:{b.admin[1]}/readyz'" in test[3]


def test_compose_advertises_the_host_it_is_told() -> None:
    brokers = _broker_services(load_compose({"DLEDGER_ADVERTISE_HOST": "203.0.113.7"}))
    assert {b.advertise[0] for b in brokers.values() if b.advertise} == {"203.0.113.7"}
    assert len(brokers) == 6 and all(b.advertise for b in brokers.values())


def test_compose_takes_its_ports_and_image_from_the_environment() -> None:
    """A second cluster on the same host (tests/deploy/test_containers.py runs one): every
    published port and the image come from variables, each broker listening on, publishing and
    advertising the port it is given."""
    names = ("a0", "a1", "a2", "b0", "b1", "b2")
    env = {"DLEDGER_NAMESRV_PORT": "40000", "DLEDGER_IMAGE": "localhost/dledger:t1"}
    for i, name in enumerate(names):
        for j, kind in enumerate(("", "_GRPC", "_ADMIN")):
            env[f"DLEDGER_{name.upper()}{kind}_PORT"] = str(40001 + 3 * i + j)
    compose = load_compose(env)
    services = compose["services"]
    assert {s["image"] for s in services.values()} == {"localhost/dledger:t1"}
    assert published_ports(services["namesrv"]) == [(40000, 9876)]
    brokers = _broker_services(compose)
    for i, name in enumerate(names):
        b, port = brokers[name], 40001 + 3 * i
        assert b.listen[1] == port and b.advertise == ("127.0.0.1", port)
        assert b.grpc is not None and b.grpc[1] == port + 1 and b.admin[1] == port + 2
        assert sorted(published_ports(services[name])) == [(p, p) for p in (port, port + 1, port + 2)]
    host_ports = [h for s in services.values() for h, _ in published_ports(s)]
    assert sorted(host_ports) == list(range(40000, 40019))


def test_compose_interpolation_reads_as_compose_does() -> None:
    assert compose_interpolate("${A:-x}:${B-y}:$${C}", {"A": "", "B": ""}) == "x::${C}"
    assert compose_interpolate("${A}", {"A": "v"}) == "v"
    with pytest.raises(ValueError, match="unsupported interpolation"):
        compose_interpolate("$A", {})


# --- Kubernetes ----------------------------------------------------------------------------------

@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_manifests_pass_the_kubernetes_schemas(version: str) -> None:
    docs = k8s_documents()
    kinds = sorted({d["kind"] for _, d in docs})
    assert kinds == ["Deployment", "PodDisruptionBudget", "Service", "StatefulSet"]
    for path, doc in docs:
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as err:
            pytest.fail(f"{path.name} {doc['kind']}/{doc['metadata']['name']}: {err.message}")


def test_the_schema_check_catches_a_misspelt_field() -> None:
    sts = next(iter(k8s_objects("StatefulSet").values()))
    bad = {**sts, "spec": {**sts["spec"], "podManagmentPolicy": "Parallel"}}
    with pytest.raises(kubernetes_validate.ValidationError, match="podManagmentPolicy"):
        kubernetes_validate.validate(bad, K8S_VERSIONS[-1], strict=True)


def _selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def _ports(container: dict[str, Any]) -> dict[str, int]:
    return {p["name"]: p["containerPort"] for p in container["ports"]}


def test_each_group_is_a_statefulset_with_its_services_budget_probes_and_volumes() -> None:
    services, budgets = k8s_objects("Service"), k8s_objects("PodDisruptionBudget")
    statefulsets = k8s_objects("StatefulSet")
    assert sorted(statefulsets) == ["dledger-a", "dledger-b"]
    for name, sts in statefulsets.items():
        spec, pod = sts["spec"], sts["spec"]["template"]
        labels = pod["metadata"]["labels"]
        assert spec["selector"]["matchLabels"] == labels and spec["replicas"] == 3
        assert spec["podManagementPolicy"] == "Parallel", "OrderedReady never gets a quorum"
        headless = services[spec["serviceName"]]["spec"]
        assert headless["clusterIP"] == "None" and headless["publishNotReadyAddresses"] is True
        assert _selects(headless["selector"], labels)
        clients = [s for n, s in services.items() if n != spec["serviceName"]
                   and _selects(s["spec"]["selector"], labels)]
        assert len(clients) == 1 and {"client", "grpc"} <= {
            p["targetPort"] for p in clients[0]["spec"]["ports"]}
        pdbs = [b for b in budgets.values() if _selects(b["spec"]["selector"]["matchLabels"], labels)]
        assert [b["spec"]["maxUnavailable"] for b in pdbs] == [1], name
        (container,) = pod["spec"]["containers"]
        assert _ports(container) == {k: PORTS[k] for k in ("client", "peer", "admin", "grpc")}
        assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "admin"}
        assert container["livenessProbe"]["httpGet"] == {"path": "/livez", "port": "admin"}
        claims = {c["metadata"]["name"] for c in spec["volumeClaimTemplates"]}
        mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
        assert mounts.get("data") == "/data" and "data" in claims
        assert pod["spec"]["securityContext"]["runAsNonRoot"] is True


def _render_pods(sts: dict[str, Any], tmp_path: Path) -> list[BrokerArgs]:
    """Each pod's `dledger-broker start` command, as the StatefulSet's pods would run it."""
    (container,) = sts["spec"]["template"]["spec"]["containers"]
    out = []
    for ordinal in range(sts["spec"]["replicas"]):
        pod = f"{sts['metadata']['name']}-{ordinal}"
        env = pod_environment(container, pod, NAMESPACE)
        argv = [k8s_expand(w, env) for w in container["command"] + container.get("args", [])]
        out.append(parse_broker_command(record_command(argv, env, tmp_path, _copied_programs())))
    return out


def test_statefulset_pods_render_a_peer_list_the_broker_accepts(tmp_path: Path) -> None:
    namesrv_port = {p["port"] for p in k8s_objects("Service")["dledger-namesrv"]["spec"]["ports"]}
    for name, sts in k8s_objects("StatefulSet").items():
        (container,) = sts["spec"]["template"]["spec"]["containers"]
        ports = _ports(container)
        pods = _render_pods(sts, tmp_path)
        service, group = sts["spec"]["serviceName"], pods[0].node.group
        stable = [f"{name}-{i}.{service}.{NAMESPACE}.svc.cluster.local" for i in range(len(pods))]
        expected = {f"n{i}": (host, ports["peer"]) for i, host in enumerate(stable)}
        assert name == f"dledger-{group}"
        for ordinal, b in enumerate(pods):
            assert b.node.group == group and b.node.node_id == f"n{ordinal}"
            assert b.node.peers == expected, f"{name}-{ordinal}: --peers {b.node.peers}"
            assert b.advertise == (stable[ordinal], ports["client"])
            assert b.listen == ("0.0.0.0", ports["client"])
            assert b.admin == (stable[ordinal], ports["admin"])  # reachable, as registered
            assert b.grpc == ("0.0.0.0", ports["grpc"])
            assert Path(b.node.data_dir).is_relative_to("/data")
            assert b.namesrv == ("dledger-namesrv:9876",) and namesrv_port == {9876}
        assert len({b.node.node_id for b in pods}) == len(pods) == 3


def test_the_rendering_follows_the_manifest(tmp_path: Path) -> None:
    """The rendering is of the manifest, not of fixed names: a StatefulSet renamed, with five
    replicas, a service of another name and extra arguments renders accordingly."""
    sts = yaml.safe_load(yaml.safe_dump(k8s_objects("StatefulSet")["dledger-a"]))
    sts["metadata"]["name"], sts["spec"]["replicas"] = "orders", 5
    (container,) = sts["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e for e in container["env"]}
    env["DLEDGER_REPLICAS"]["value"], env["DLEDGER_PEER_SERVICE"]["value"] = "5", "orders-hl"
    container["env"].append({"name": "EXTRA", "value": "async"})
    container["args"] = ["--flush-mode", "$(EXTRA)"]
    pods = _render_pods(sts, tmp_path)
    assert [b.node.node_id for b in pods] == ["n0", "n1", "n2", "n3", "n4"]
    assert pods[4].node.peers["n3"] == (f"orders-3.orders-hl.{NAMESPACE}.svc.cluster.local", 20911)
    assert {b.node.flush_mode for b in pods} == {"async"}


@pytest.mark.parametrize("change, message", [
    ({"POD_NAME": "broker"}, "does not end in -<ordinal>"),
    ({"POD_NAME": "dledger-a-x"}, "does not end in -<ordinal>"),
    ({"POD_NAME": "dledger-a-3"}, "has ordinal 3, but the group has 3 members"),
    ({"DLEDGER_REPLICAS": "three"}, "DLEDGER_REPLICAS must be a number"),
    ({"POD_NAMESPACE": ""}, "POD_NAMESPACE is not set"),
    ({"DLEDGER_GROUP": ""}, "DLEDGER_GROUP is not set"),
])
def test_the_entrypoint_refuses_what_it_cannot_render(tmp_path: Path, change: dict[str, str],
                                                      message: str) -> None:
    (container,) = k8s_objects("StatefulSet")["dledger-a"]["spec"]["template"]["spec"]["containers"]
    env = {**pod_environment(container, "dledger-a-0", NAMESPACE), **change}
    with pytest.raises(CommandFailed) as failed:
        record_command(container["command"], env, tmp_path, _copied_programs())
    assert failed.value.returncode == 2 and message in failed.value.stderr
    assert not (tmp_path / "argv").exists(), "dledger-broker ran anyway"


def test_the_namesrv_deployment_serves_where_its_service_points() -> None:
    (deployment,) = k8s_objects("Deployment").values()
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    listen = parse_namesrv_command(container["command"] + container.get("args", []))
    assert listen == ("0.0.0.0", _ports(container)["http"])
    service = k8s_objects("Service")["dledger-namesrv"]["spec"]
    assert _selects(service["selector"], deployment["spec"]["template"]["metadata"]["labels"])
    assert [(p["port"], p["targetPort"]) for p in service["ports"]] == [(PORTS["namesrv"], "http")]
    assert deployment["spec"]["replicas"] == 1 and deployment["spec"]["strategy"]["type"] == "Recreate"


def test_every_pod_runs_the_same_image_on_the_ports_the_image_exposes() -> None:
    images, ports = set(), set()
    for _, doc in k8s_documents():
        for c in doc.get("spec", {}).get("template", {}).get("spec", {}).get("containers", []):
            images.add(c["image"])
            ports |= set(_ports(c).values())
    exposed = {int(p) for w, a in dockerfile_instructions() if w == "EXPOSE" for p in a.split()}
    assert len(images) == 1 and ports <= exposed
    assert ENTRYPOINT_SCRIPT.stat().st_mode & 0o111, "the entrypoint script is not executable"


def test_every_namesrv_and_broker_gets_the_same_cluster_credential() -> None:
    """Registrations are signed (docs/security.md): compose gives each container
    DLEDGER_CLUSTER_KEY from the operator's environment (required); every pod of the manifests
    reads it from one Secret."""
    compose = load_compose()
    for name, s in compose["services"].items():
        assert s.get("environment", {}).get("DLEDGER_CLUSTER_KEY", "").startswith(
            "${DLEDGER_CLUSTER_KEY:?"), f"{name} has no required DLEDGER_CLUSTER_KEY"
    refs = set()
    for _, doc in k8s_documents():
        for c in doc.get("spec", {}).get("template", {}).get("spec", {}).get("containers", []):
            (entry,) = [e for e in c.get("env", []) if e["name"] == "DLEDGER_CLUSTER_KEY"]
            ref = entry["valueFrom"]["secretKeyRef"]
            refs.add((ref["name"], ref["key"]))
    assert refs == {("dledger-cluster-key", "key")}
