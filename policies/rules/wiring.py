"""Wiring: one fact, three layers. The same fact must agree in the Azure plan, the Ansible variables
and the Kubernetes configuration the roles render from them (superkube.cluster.wiring renders the roles'
own variables offline, over the inventory the stack would have)."""

from __future__ import annotations

import functools
import ipaddress
import json
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import yaml

from policies.rules.compute import _cloud_init_files, _kubelet_flag
from policies.rules.network import _routes as network_routes
from superkube.cluster import autoscaling, dns, kube, reference, wiring
from superkube.cluster.cloudinit import JOIN_PATH_UNIT, REGISTRATION_FILE
from superkube.cluster.kube import (
    APISERVERS,
    CPU_NODES,
    ETCD_EVENTS,
    ETCD_MAIN,
    GPU_NODES,
    METRICS_STORE,
    MONITORING,
    NAT_HOST,
    SERVING_CERTS_MODULE,
)
from superkube.model.policy import Finding, PlanResource, Rule, RuleConfig, StackView

LB = "azure-native:network:LoadBalancer"
KUBECONFIG_URLS = {
    "kube_apiserver": "kube_apiserver_url",
    "kubelet": "kubelet_apiserver_url",
    "kube_proxy": "kube_proxy_apiserver_url",
}
# Clients on the API server hosts talk to the API server beside them: Azure's internal load balancer
# drops a backend's flow to its own frontend when it is balanced back to that backend.
LOCAL_KUBECONFIG_URLS = {
    "kube_apiserver": "kube_apiserver_local_url",
    "kube_controller_manager": "kube_controller_manager_apiserver_url",
    "gang_scheduler": "gang_scheduler_apiserver_url",
    "cluster_autoscaler": "cluster_autoscaler_apiserver_url",
}
ROLE_HOSTS = {
    "kube_apiserver": (APISERVERS,),
    "kube_controller_manager": (APISERVERS,),
    "gang_scheduler": (APISERVERS,),
    "kube_pki": (APISERVERS,),
    "kubelet": (GPU_NODES, CPU_NODES),
    "kube_proxy": (GPU_NODES, CPU_NODES, NAT_HOST),
}


class _Rendered:
    """The plan's hosts and what the roles would render for them, made once per check."""

    def __init__(self, view: StackView, config: RuleConfig) -> None:
        self.hosts = wiring.plan_hosts(view.resources)
        self.ok = bool(config.inventory)
        self.engine = wiring.Wiring(self.hosts, config.inventory, config.group_vars) if self.ok else None
        self.cache: dict[tuple[str, str, str], Any] = {}

    def of(self, *groups: str) -> list[wiring.PlanHost]:
        return [h for h in self.hosts if h.group in groups]

    def var(self, role: str, host: wiring.PlanHost, name: str) -> Any:
        key = (role, host.name, name)
        if key not in self.cache:
            assert self.engine is not None
            self.cache[key] = self.engine.render(role, host, [name])[name]
        return self.cache[key]


def _rendered(view: StackView, config: RuleConfig) -> _Rendered:
    key = id(config)
    cached = getattr(view, "_wiring", None)
    if cached is None or cached[0] != key:
        cached = (key, _Rendered(view, config))
        view._wiring = cached
    rendered: _Rendered = cached[1]
    return rendered


RenderedCheck = Callable[[StackView, RuleConfig, _Rendered], Iterator[Finding]]


def _rendering(check: RenderedCheck) -> Callable[[StackView, RuleConfig], Iterator[Finding]]:
    """A rule over the rendered wiring; without an inventory it says so instead of passing."""

    @functools.wraps(check)
    def rule(view: StackView, config: RuleConfig) -> Iterator[Finding]:
        r = _rendered(view, config)
        if not r.ok:
            yield Finding(
                "no inventory to compare with: check a stack (or a plan with its config), not bare resources"
            )
            return
        yield from check(view, config, r)

    return rule


def _lb_ip(view: StackView) -> str | None:
    for lb in view.of_type(LB):
        for frontend in lb.props.get("frontendIPConfigurations") or []:
            if frontend.get("privateIPAddress"):
                return str(frontend["privateIPAddress"])
    return None


@_rendering
def _api_endpoint(view: StackView, config: RuleConfig, r: _Rendered) -> Iterator[Finding]:
    lb = _lb_ip(view)
    if lb is None:
        yield Finding("the plan has no API-server load balancer frontend")
        return
    want = kube.apiserver_url(lb)
    for role, groups in ROLE_HOSTS.items():
        if role not in KUBECONFIG_URLS:
            continue
        for host in r.of(*groups)[:1]:
            got = r.var(role, host, KUBECONFIG_URLS[role])
            if got != want:
                yield Finding(
                    f"{role} points its kubeconfig at {got}, not the load balancer {want}", host.urn
                )
    local = f"https://127.0.0.1:{kube.APISERVER_PORT}"
    for role, name in LOCAL_KUBECONFIG_URLS.items():
        for host in r.of(APISERVERS)[:1]:
            got = r.var(role, host, name)
            if got != local:
                yield Finding(
                    f"{role} on an API server host points its kubeconfig at {got}, not the API server "
                    f"beside it ({local}); through the load balancer a flow balanced back to the same "
                    "host is dropped",
                    host.urn,
                )
    for host in r.of(APISERVERS)[:1]:
        sans = set(r.var("kube_pki", host, "kube_pki_apiserver_ips"))
        apis = {h.address for h in r.of(APISERVERS)}
        service = kube.service_ip(config.service_cidr) if config.service_cidr else None
        missing = sorted(({lb} | apis | ({service} if service else set())) - sans)
        if missing:
            yield Finding(
                f"the API's serving certificate would lack {', '.join(missing)} of the plan", host.urn
            )


@_rendering
def _service_cidr(view: StackView, config: RuleConfig, r: _Rendered) -> Iterator[Finding]:
    want = config.service_cidr
    for host in r.of(APISERVERS)[:1]:
        for role, name in (
            ("kube_apiserver", "kube_apiserver_all_flags"),
            ("kube_controller_manager", "kube_controller_manager_all_flags"),
        ):
            got = r.var(role, host, name).get("service-cluster-ip-range")
            if got != want:
                yield Finding(f"{role} serves service range {got}, the stack {want}", host.urn)
    for host in r.of(GPU_NODES, CPU_NODES)[:1]:
        dns = r.var("kubelet", host, "kubelet_all_config").get("clusterDNS") or []
        if want and not all(ipaddress.ip_address(d) in ipaddress.ip_network(want) for d in dns):
            yield Finding(f"the kubelet's cluster DNS {dns} is outside the service range {want}", host.urn)
        in_cluster = any(x.type.startswith("kubernetes:") for x in view.resources)
        if in_cluster:  # a stack without the in-cluster layer serves DNS another way
            served = _dns_served(view)
            for address in dns:
                if address not in served:
                    yield Finding(
                        f"the kubelets send every pod's DNS queries to {address}, where the in-cluster layer "
                        f"serves none (it serves DNS at {', '.join(sorted(served)) or 'no address'})",
                        host.urn,
                    )
    routes = [
        p for _, p in network_routes(view) if str(p.get("nextHopType", "")).lower() == "virtualappliance"
    ]
    if not any(p.get("addressPrefix") == want for p in routes):
        yield Finding(f"no hub route sends the service range {want} to the NAT host")


def _dns_served(view: StackView) -> set[str]:
    """The cluster IPs where the layer serves DNS: a Service on 53/UDP and 53/TCP whose selector picks
    the pods of a Deployment with replicas that runs CoreDNS."""
    pods = []
    for d in view.of_type("kubernetes:apps/v1:Deployment"):
        spec = d.props.get("spec") or {}
        template = spec.get("template") or {}
        images = [str(c.get("image", "")) for c in (template.get("spec") or {}).get("containers") or []]
        if spec.get("replicas", 1) and any("/coredns:" in i or i.startswith("coredns:") for i in images):
            pods.append((template.get("metadata") or {}).get("labels") or {})
    served = set()
    for s in view.of_type("kubernetes:core/v1:Service"):
        spec = s.props.get("spec") or {}
        ports = {(p.get("port"), p.get("protocol", "TCP")) for p in spec.get("ports") or []}
        selector = spec.get("selector") or {}
        backed = selector and any(selector.items() <= labels.items() for labels in pods)
        if {(dns.PORT, "UDP"), (dns.PORT, "TCP")} <= ports and backed and spec.get("clusterIP"):
            served.add(str(spec["clusterIP"]))
    return served


@_rendering
def _etcd_urls(view: StackView, config: RuleConfig, r: _Rendered) -> Iterator[Finding]:
    main = sorted(kube.etcd_urls([h.address for h in r.of(ETCD_MAIN)]))
    events = sorted(kube.etcd_urls([h.address for h in r.of(ETCD_EVENTS)]))
    for host in r.of(APISERVERS)[:1]:
        flags = r.var("kube_apiserver", host, "kube_apiserver_all_flags")
        got_main = sorted(str(flags.get("etcd-servers", "")).split(","))
        override = str(flags.get("etcd-servers-overrides", ""))
        got_events = (
            sorted(override.removeprefix("/events#").split(";")) if override.startswith("/events#") else []
        )
        if got_main != main:
            yield Finding(
                f"--etcd-servers is {','.join(got_main)}, the plan's main members {','.join(main)}", host.urn
            )
        if got_events != events:
            yield Finding(
                f"--etcd-servers-overrides sends Events to {';'.join(got_events) or 'nowhere'}, "
                f"the plan's events members are {';'.join(events)}",
                host.urn,
            )


def _storage_nodes(flags: list[str]) -> list[str]:
    values = [f.split("=", 1)[1] for f in flags if f.startswith("-storageNode=")]
    return sorted(values[0].split(",")) if values else []


@_rendering
def _monitoring(view: StackView, config: RuleConfig, r: _Rendered) -> Iterator[Finding]:
    """Each Prometheus host runs one shard, all shards once; each shard writes to a store host's
    vminsert (or the store the spec names); every store host's vminsert and vmselect reach every
    store host's vmstorage."""
    stores = r.of(METRICS_STORE)
    store_ips = sorted(h.address for h in stores)
    shards: list[int] = []
    hosts = r.of(MONITORING)
    for host in hosts:
        mine = [int(s) for s in r.var("monitoring", host, "monitoring_host_shards")]
        shards += mine
        urls = r.var("monitoring", host, "monitoring_store_urls")
        for shard in mine:
            url = str(urls[shard]) if shard < len(urls) else ""
            at = url.split("://", 1)[-1].split("/", 1)[0]
            own = any(at == f"{ip}:{kube.VMINSERT_PORT}" for ip in store_ips)
            external = config.monitoring.get("external_store")
            if not own and not (external and url == external):
                yield Finding(
                    f"Prometheus shard {shard} on {host.name} writes to {url or 'nowhere'}, not to a store host's "
                    f"vminsert ({', '.join(f'{ip}:{kube.VMINSERT_PORT}' for ip in store_ips)})",
                    host.urn,
                )
    if sorted(shards) != list(range(len(hosts))):
        yield Finding(
            f"the {len(hosts)} Prometheus hosts run shards {sorted(shards)}, not each of 0..{len(hosts) - 1} once"
        )
    for host in stores:
        flags = r.var("metrics_store", host, "metrics_store_flags")
        for part, port in (
            ("vminsert", kube.VMSTORAGE_INSERT_PORT),
            ("vmselect", kube.VMSTORAGE_SELECT_PORT),
        ):
            got = _storage_nodes([str(f) for f in flags.get(part, [])])
            want = sorted(f"{ip}:{port}" for ip in store_ips)
            if got != want:
                yield Finding(
                    f"{part} on {host.name} reaches vmstorage at {','.join(got) or 'nowhere'}, the plan's store "
                    f"hosts are {','.join(want)}",
                    host.urn,
                )


def _vmss(view: StackView, host: wiring.PlanHost) -> PlanResource:
    return next(s for s in view.of_type("azure-native:compute:VirtualMachineScaleSet") if s.urn == host.urn)


@_rendering
def _max_pods(view: StackView, config: RuleConfig, r: _Rendered) -> Iterator[Finding]:
    for host in r.of(GPU_NODES, CPU_NODES):
        vmss = _vmss(view, host)
        nics = ((vmss.props.get("virtualMachineProfile") or {}).get("networkProfile") or {}).get(
            "networkInterfaceConfigurations"
        ) or [{}]
        pod_ips = max(len(nics[0].get("ipConfigurations") or []) - 1, 0)
        got = r.var("kubelet", host, "kubelet_all_config").get("maxPods")
        host_network = kube.HOST_NETWORK_PODS[r.var("kubelet", host, "kubelet_pool")["role"]]
        want = pod_ips + host_network
        if got != want:
            yield Finding(
                f"kubelet maxPods is {got}; the NIC carries {pod_ips} pod IPs, so it must be "
                f"{pod_ips} + {host_network} host-network pods = {want}",
                vmss.urn,
            )


def _template_tags(tags: Mapping[str, str], kind: str) -> dict[str, str]:
    """A scale set's node-template tags of one kind (label, taint), keyed as written."""
    prefix = autoscaling.template_tag(kind, "")
    return {k: v for k, v in tags.items() if k.startswith(prefix)}


@_rendering
def _registration(view: StackView, config: RuleConfig, r: _Rendered) -> Iterator[Finding]:
    for host in r.of(GPU_NODES, CPU_NODES):
        vmss = _vmss(view, host)
        registration = (_cloud_init_files(vmss) or {}).get(REGISTRATION_FILE, "")
        labels = {
            k: v for k, _, v in (x.partition("=") for x in _kubelet_flag(registration, "--node-labels")) if k
        }
        taints = set(_kubelet_flag(registration, "--register-with-taints")) - {""}
        tags = vmss.tags
        if autoscaling.is_autoscaled(tags):
            # both sides in the tags' own encoding (superkube.cluster.autoscaling.template_tag)
            reg_labels = {autoscaling.template_tag("label", k): v for k, v in labels.items()}
            tag_labels = _template_tags(tags, "label")
            if tag_labels != reg_labels:
                diff = sorted(set(tag_labels.items()) ^ set(reg_labels.items()))
                yield Finding(
                    f"node labels and the autoscaler's node-template labels differ: {diff}", vmss.urn
                )
            reg_taints = {
                autoscaling.template_tag("taint", key.partition("=")[0]): f"{key.partition('=')[2]}:{effect}"
                for key, _, effect in (t.rpartition(":") for t in taints)
            }
            tag_taints = _template_tags(tags, "taint")
            if tag_taints != reg_taints:
                yield Finding(
                    f"node taints {sorted(reg_taints.items())} and the autoscaler's node-template taints "
                    f"{sorted(tag_taints.items())} differ",
                    vmss.urn,
                )
        bootstrap = r.var("kubelet", host, "kubelet_bootstrap_kubeconfig")
        join = (_cloud_init_files(vmss) or {}).get(JOIN_PATH_UNIT, "")
        if f"PathExists={bootstrap}\n" not in join:
            yield Finding(
                f"cloud-init's join unit does not wait for {bootstrap}, where the kubelet role writes the "
                "bootstrap kubeconfig: the node would never join",
                vmss.urn,
            )
        config_doc = r.var("kubelet", host, "kubelet_all_config")
        if "registerWithTaints" in config_doc or (
            "registerNode" in config_doc and not config_doc["registerNode"]
        ):
            yield Finding(
                "the kubelet configuration writes registration too; cloud-init alone owns labels and taints",
                vmss.urn,
            )


@_rendering
def _lab_only(view: StackView, config: RuleConfig, r: _Rendered) -> Iterator[Finding]:
    for host in r.of(GPU_NODES)[:1] + r.of(CPU_NODES)[:1]:  # one of each group (its group vars)
        urn = _vmss(view, host).urn
        document = r.var("kubelet", host, "kubelet_all_config")
        for field, lab_value in kube.LAB_ONLY_KUBELET_CONFIG.items():
            if field in document and document[field] == lab_value:
                yield Finding(
                    f"the kubelet configuration sets {field}: {json.dumps(lab_value)}, a value only the lab "
                    f"may set ({kube.LAB_ONLY_KUBELET_WHY[field]})",
                    urn,
                )
        for name, lab_value in kube.LAB_ONLY_NODE_SOFTWARE.items():
            if r.var("node_software", host, name) == lab_value:
                yield Finding(
                    f"{name} is {json.dumps(lab_value)}, a value only the lab may set (its hosts are "
                    "containers; a VM's runtime lowers OOM scores and makes keyrings)",
                    urn,
                )
    for host in r.of(GPU_NODES)[:1] + r.of(CPU_NODES)[:1] + r.of(NAT_HOST)[:1]:
        proxy = r.var("kube_proxy", host, "kube_proxy_all_config")
        for section, fields in kube.LAB_ONLY_KUBE_PROXY_CONFIG.items():
            for field, lab_value in fields.items():
                if (proxy.get(section) or {}).get(field) == lab_value:
                    yield Finding(
                        f"the kube-proxy configuration on {host.group} sets {section}.{field}: "
                        f"{json.dumps(lab_value)}, a value only the lab may set (its hosts share one "
                        "kernel's conntrack table; a VM's kube-proxy sizes its own)",
                        host.urn,
                    )


@_rendering
def _kubelet_serving(view: StackView, config: RuleConfig, r: _Rendered) -> Iterator[Finding]:
    """API servers that verify kubelets against the cluster CA need kubelets serving a certificate it
    signed (asked for with serverTLSBootstrap) and an approver for those requests in the layer."""
    for apiserver in r.of(APISERVERS)[:1]:
        if not r.var("kube_apiserver", apiserver, "kube_apiserver_all_flags").get(
            "kubelet-certificate-authority"
        ):
            return
        for host in r.of(GPU_NODES)[:1] + r.of(CPU_NODES)[:1]:
            if r.var("kubelet", host, "kubelet_all_config").get("serverTLSBootstrap") is not True:
                yield Finding(
                    f"the API servers verify kubelets against the cluster CA, but the kubelets of {host.group} "
                    "serve a self-signed certificate (serverTLSBootstrap is not true): logs, exec and "
                    "port-forward fail there",
                    _vmss(view, host).urn,
                )
        approvers = [
            d for d in view.of_type("kubernetes:apps/v1:Deployment")
            if (d.props.get("spec") or {}).get("replicas", 1) != 0
            and any(SERVING_CERTS_MODULE in (c.get("command") or [])
                    for c in (((d.props.get("spec") or {}).get("template") or {}).get("spec") or {}).get("containers") or [])
        ]  # fmt: skip
        in_cluster = any(x.type.startswith("kubernetes:") for x in view.resources)
        if in_cluster and not approvers:  # a stack without the in-cluster layer deploys it elsewhere
            yield Finding(
                f"no Deployment in the in-cluster layer runs {SERVING_CERTS_MODULE}: the kubelets' serving-certificate "
                "requests would wait unapproved, and the API servers reach no kubelet",
                apiserver.urn,
            )


@_rendering
def _cluster_name(view: StackView, config: RuleConfig, r: _Rendered) -> Iterator[Finding]:
    want = config.cluster
    for host in r.of(APISERVERS)[:1]:
        got = r.var("kube_controller_manager", host, "kube_controller_manager_all_flags").get("cluster-name")
        if got != want:
            yield Finding(f"kube-controller-manager names the cluster {got!r}, the stack {want!r}", host.urn)
    for s in view.of_type("azure-native:compute:VirtualMachineScaleSet"):
        for key in ("cluster", autoscaling.NAME_TAG):
            if key in s.tags and s.tags[key] != want:
                yield Finding(f"scale set tag {key} is {s.tags[key]!r}, the stack {want!r}", s.urn)


@_rendering
def _component_configs(view: StackView, config: RuleConfig, r: _Rendered) -> Iterator[Finding]:
    version = str(wiring.inventory_vars(config.inventory).get("superkube_kubernetes_version", ""))
    documents = []
    for host in r.of(GPU_NODES, CPU_NODES)[:1]:
        documents.append((host, r.var("kubelet", host, "kubelet_all_config")))
    for host in r.of(GPU_NODES, CPU_NODES, NAT_HOST)[:1]:
        documents.append((host, r.var("kube_proxy", host, "kube_proxy_all_config")))
    for host in r.of(APISERVERS)[:1]:
        assert r.engine is not None
        documents.append(
            (host, yaml.safe_load(r.engine.template("gang_scheduler", host, "scheduler-config.yaml.j2")))
        )
    for host, document in documents:
        try:
            found = reference.problems(document, version)
        except reference.NoReference as exc:
            found = [str(exc)]
        for problem in found:
            yield Finding(problem, host.urn)


RULES = [
    Rule(
        "wiring-apiserver-endpoint",
        "critical",
        "Every kubeconfig off the API server hosts points at the plan's API load balancer (on them, at "
        "the API server beside it), whose serving certificate names it, every API server and the "
        "first service IP.",
        "Write the inventory again (superkube inventory) and drop group variables that override *_apiserver_url.",
        _api_endpoint,
    ),
    Rule(
        "wiring-service-cidr",
        "critical",
        "The service range is the same in the stack, the hub's route to the NAT host, the API server, "
        "the controller-manager and the kubelets' cluster DNS, which the in-cluster layer serves "
        "(CoreDNS behind a Service at that address on 53/UDP and 53/TCP).",
        "Change superkube:service_cidr only, then write the inventory again; drop flag overrides of it "
        "and of the kubelets' cluster DNS, and keep the dns component in the in-cluster layer.",
        _service_cidr,
    ),
    Rule(
        "wiring-etcd-urls",
        "critical",
        "The API server stores in the plan's main etcd members and sends Events to the plan's events members.",
        "Keep etcd_main and etcd_events as the inventory groups the Pulumi program tags.",
        _etcd_urls,
    ),
    Rule(
        "wiring-monitoring-store",
        "high",
        "Each Prometheus host runs one shard and writes to a store host's vminsert; every store host's "
        "vminsert and vmselect reach every store host in the plan.",
        "Keep monitoring and metrics_store as the inventory groups the Pulumi program tags; drop group "
        "variables that override monitoring_store_urls or metrics_store_hosts.",
        _monitoring,
    ),
    Rule(
        "wiring-kubelet-max-pods",
        "high",
        "Each pool's kubelet maxPods is its NICs' pod IPs plus the host-network agents.",
        "Change pod_ips_per_node in superkube:node_pools and write the inventory again; drop maxPods overrides.",
        _max_pods,
    ),
    Rule(
        "wiring-node-registration",
        "high",
        "Nodes register with exactly the labels and taints the autoscaler's node-template tags advertise, "
        "written by cloud-init alone, whose join waits for the bootstrap kubeconfig the kubelet role writes.",
        "Set labels and taints in superkube:node_pools only (NodePool writes both the tags and cloud-init); "
        "write the inventory again with superkube inventory.",
        _registration,
    ),
    Rule(
        "wiring-lab-only",
        "critical",
        "No stack's nodes carry a value only the lab may set: failCgroupV1: false, image garbage "
        "collection off or the lab's disk eviction thresholds in the kubelet's configuration, or "
        "containerd's restricted OOM scores and runc without session keyrings.",
        "Drop those from kubelet_extra_config and the node_software_restrict_oom_score_adj and "
        "node_software_no_new_keyring variables; node images run cgroup v2 on VMs with disks of their own.",
        _lab_only,
    ),
    Rule(
        "wiring-kubelet-serving-certificates",
        "high",
        "When the API servers verify kubelets against the cluster CA, every node group's kubelets ask "
        "for a serving certificate it signs (serverTLSBootstrap) and the layer runs their approver.",
        "Keep serverTLSBootstrap: true in the kubelet role (not overridden in kubelet_extra_config) and the "
        "serving-certs component in the in-cluster layer.",
        _kubelet_serving,
    ),
    Rule(
        "wiring-cluster-name",
        "medium",
        "The cluster's name is the same in the scale sets' tags and the controller-manager.",
        "Set superkube:cluster_name (or the stack name) only; drop cluster-name flag overrides.",
        _cluster_name,
    ),
    Rule(
        "wiring-component-config",
        "high",
        "The kubelet, kube-proxy and scheduler configurations the roles write have only fields of the "
        "cluster's Kubernetes release, each of its type.",
        "Fix the field named in *_extra_config (or the role); the reference is data/kubernetes/<minor>/.",
        _component_configs,
    ),
]
