"""What of deploy/k8s/ `podman kube play` can run (Pods, Deployments, PersistentVolumeClaims; not
StatefulSets, Services or PodDisruptionBudgets): one group's StatefulSet rendered as the
Kubernetes controller would make its pods, each a Pod with the template's container as written
(image, command, probes, security context, mounts) and its volume claim a PVC
``data-<pod>``, and the NameServer's Deployment as written. What a cluster would provide is
stood in for, and only that: the downward API's pod name and namespace and the Secret's key
become plain values, and the headless Service's DNS names of the pods
(``<pod>.<service>.<namespace>.svc.cluster.local``) and the NameServer Service's name become
``hostAliases`` entries at fixed addresses on a podman network of the test's own. And one change
for podman 4.3, whose kube play publishes every ``containerPort`` on the host's same port (three
pods cannot all have 8080): the ports list is dropped, the probes naming a port get its number."""

from __future__ import annotations

import copy
import ipaddress
from typing import Any

import yaml

from tests.ops.deploy_files import k8s_objects

NAMESPACE = "mq"
CLUSTER_DOMAIN = "cluster.local"


def _plain_env(container: dict[str, Any], values: dict[str, str]) -> None:
    """Replace the downward-API and Secret references of ``container``'s env by ``values``."""
    for entry in container.get("env", []):
        if "valueFrom" in entry:
            assert entry["name"] in values, f"no stand-in for {entry['name']}"
            entry.pop("valueFrom")
            entry["value"] = values[entry["name"]]


def _unpublished(container: dict[str, Any]) -> None:
    """``container`` without its ``ports``, its probes' named ports replaced by their numbers."""
    numbers = {p["name"]: p["containerPort"] for p in container.pop("ports", [])}
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        get = container.get(probe, {}).get("httpGet")
        if get is not None and isinstance(get["port"], str):
            get["port"] = numbers[get["port"]]


def render_group(name: str, image: str, cluster_key: str, subnet: str, suffix: str
                 ) -> tuple[str, list[str], dict[str, str]]:
    """The YAML for `podman kube play` (the NameServer's Deployment, then per pod its PVC and
    its Pod), the address of each pod in the order kube play creates them (for ``--ip``), and
    pod name -> address. The StatefulSet ``name`` and the Deployment are renamed with
    ``suffix`` (the pods' and volumes' names are global on a host; the entrypoint renders the
    peers of whatever the StatefulSet is called)."""
    sts = k8s_objects("StatefulSet")[name]
    statefulset = name + suffix
    namesrv = copy.deepcopy(k8s_objects("Deployment")["dledger-namesrv"])
    namesrv["metadata"]["name"] += suffix
    replicas, service = sts["spec"]["replicas"], sts["spec"]["serviceName"]
    hosts = list(ipaddress.ip_network(subnet).hosts())
    addresses = {"dledger-namesrv": str(hosts[9])}
    for ordinal in range(replicas):
        addresses[f"{statefulset}-{ordinal}"] = str(hosts[10 + ordinal])
    aliases = [{"ip": addresses["dledger-namesrv"], "hostnames": ["dledger-namesrv"]}] + [
        {"ip": addresses[f"{statefulset}-{i}"],
         "hostnames": [f"{statefulset}-{i}.{service}.{NAMESPACE}.svc.{CLUSTER_DOMAIN}"]}
        for i in range(replicas)]
    docs: list[dict[str, Any]] = []
    ns_pod = namesrv["spec"]["template"]["spec"]
    for c in ns_pod["containers"]:
        c["image"] = image
        _unpublished(c)
        _plain_env(c, {"DLEDGER_CLUSTER_KEY": cluster_key})
    docs.append(namesrv)
    for ordinal in range(replicas):
        pod = f"{statefulset}-{ordinal}"
        spec = copy.deepcopy(sts["spec"]["template"]["spec"])
        spec.pop("affinity", None)  # scheduling: one machine here
        spec["hostname"], spec["subdomain"] = pod, service
        spec["hostAliases"] = aliases
        for c in spec["containers"]:
            c["image"] = image
            _unpublished(c)
            _plain_env(c, {"DLEDGER_CLUSTER_KEY": cluster_key, "POD_NAME": pod,
                           "POD_NAMESPACE": NAMESPACE})
        for template in sts["spec"]["volumeClaimTemplates"]:
            claim = f"{template['metadata']['name']}-{pod}"
            docs.append({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                         "metadata": {"name": claim}, "spec": copy.deepcopy(template["spec"])})
            spec.setdefault("volumes", []).append(
                {"name": template["metadata"]["name"], "persistentVolumeClaim": {"claimName": claim}})
        docs.append({"apiVersion": "v1", "kind": "Pod",
                     "metadata": {"name": pod, "labels": sts["spec"]["template"]["metadata"]["labels"]},
                     "spec": spec})
    order = ["dledger-namesrv"] + [f"{statefulset}-{i}" for i in range(replicas)]
    return yaml.safe_dump_all(docs, sort_keys=False), [addresses[p] for p in order], addresses
