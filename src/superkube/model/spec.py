"""The cluster spec: every `superkube:` config key, validated once.

`Pulumi.yaml` only types config as string, integer, boolean or array, and once a project declares
config every stack key must be declared. So scalar settings are flat keys, and the structured ones
(`node_pools`, `peered_spokes`, `limit_overrides`) are YAML documents held in string keys.

`ClusterSpec` is the single source of truth for keys, defaults and descriptions; `Pulumi.yaml` is
generated from it (`superkube config-schema --write`) and a test keeps the two equal.
"""

from __future__ import annotations

import difflib
import functools
import ipaddress
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from superkube.model import strictyaml
from superkube.model.rates import parse_rate
from superkube.model.teams import ANY, TEAM_KEY, TeamsError, TeamTuple, template_owner
from superkube.model.teams import check as teams_check

NAMESPACE = "superkube"
KUBECONFIG_KEY = "kubernetes:kubeconfig"
"""The secret config key holding the cluster's admin kubeconfig for the in-cluster layer: the Kubernetes
provider's own key, so it is never a `superkube:` declaration (Pulumi.yaml would make it required)."""

# Azure names built from these must stay within Azure's 64-80 character limits and be valid
# hostname prefixes, so cluster and pool names are short DNS labels.
REGIONS_FILE = "src/superkube/data/azure_regions.yaml"


@functools.cache
def azure_regions() -> list[str]:
    """Azure's public regions by programmatic name (data/azure_regions.yaml)."""
    path = Path(__file__).resolve().parents[1] / "data" / "azure_regions.yaml"
    return list(strictyaml.safe_load(path.read_text())["regions"])


_LABEL = re.compile(r"^[a-z][a-z0-9-]{0,18}[a-z0-9]$|^[a-z]$")
_POOL = re.compile(r"^[a-z][a-z0-9]{0,11}$")
_TAINT = re.compile(r"^[A-Za-z0-9./_-]+(=[A-Za-z0-9._-]*)?:(NoSchedule|PreferNoSchedule|NoExecute)$")
_SSH_KEY = re.compile(r"^(ssh-ed25519|ssh-rsa|ecdsa-sha2-nistp(256|384|521)) [A-Za-z0-9+/=]{40,}( .*)?$")
DISK_SKUS = ("Premium_LRS", "PremiumV2_LRS", "Premium_ZRS", "UltraSSD_LRS")
"""Managed disk SKUs fast enough for etcd's fsync-heavy writes (premium or ultra)."""

PREFLIGHT_TAINT_KEY = "superkube.io/preflight"
PREFLIGHT_RESULT_ANNOTATION = f"{PREFLIGHT_TAINT_KEY}-result"
"""The node annotation where preflight records its verdict: `passed <time>` or `failed <time>: <why>`."""
CLUSTER_LABEL = "superkube.io/cluster"
"""The node label naming a node's cluster."""
POOL_LABEL = "superkube.io/pool"
"""The node label naming a node's pool: balloons, the autoscaler's templates and policies select on it."""
GALLERY_IMAGE = "gallery:"
"""A pool image that names a version of the cluster's own node image (gallery:1.0.0), baked from the
node roles (superkube lab bake in the lab; a builder VM captured into the gallery in production)."""
NODE_IMAGE_PATTERN = r"^([^:\s]+:[^:\s]+:[^:\s]+:[^:\s]+|gallery:\d+\.\d+\.\d+)$"
ROLE_LABEL = "superkube.io/role"
"""The node label naming a node's role (gpu or cpu)."""


RESERVED_TAINT_KEYS = {
    PREFLIGHT_TAINT_KEY: "every GPU node registers behind it until its preflight passes",
    TEAM_KEY: "a pool's team comes from superkube:teams",
}
"""Taint keys a pool's nodes get from the plan; a second taint of one key and effect would make the
API server refuse the node's registration."""


def is_quorum_size(members: int) -> bool:
    """An odd count of at least 3: a majority survives a member's loss, and an even count adds no tolerance."""
    return members >= 3 and members % 2 == 1


class SpecError(Exception):
    """A user error in a stack's config: one line saying what, where, and how to fix it."""

    def __init__(self, key: str, problem: str, fix: str) -> None:
        self.key = key
        self.problem = problem
        self.fix = fix
        super().__init__(f"{key}: {problem}; {fix}")


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, str_strip_whitespace=True)


def _cidr(value: str) -> str:
    try:
        net = ipaddress.IPv4Network(value, strict=True)
    except ValueError as exc:
        raise ValueError(f"{value!r} is not an IPv4 CIDR with its host bits clear ({exc})") from None
    if not net.is_private:
        raise ValueError(f"{value} is not a private range; use RFC 1918 space such as 10.0.0.0/8")
    return str(net)


Cidr = Annotated[str, Field(pattern=r"^[0-9./]+$")]


class NodePool(_Model):
    """One node pool. Larger than the per-scale-set VM limit, it becomes several scale sets."""

    name: str = Field(description="Short pool name (a-z, 0-9, up to 12 characters); used in scale-set names.")
    role: Literal["gpu", "cpu"] = Field(description="gpu pools register behind the preflight taint.")
    vm_size: str = Field(
        pattern=r"^Standard_[A-Za-z0-9_]+$", description="Azure VM size, e.g. Standard_ND96isr_H100_v5."
    )
    nodes: int = Field(ge=1, le=100_000, description="Capacity: the most nodes the pool may hold.")
    min_nodes: int = Field(
        default=0, ge=0, description="Autoscaler minimum (0 lets the pool scale from zero)."
    )
    gpus_per_node: int = Field(default=0, ge=0, le=16, description="GPUs per VM (0 for cpu pools).")
    remediation_deadline_days: float = Field(
        default=7,
        gt=0,
        le=30,
        description=(
            "Days a node health cordoned may stay in the fleet while pods a budget protects keep it busy; "
            "then remediation deletes its VM anyway (a drained node goes at once)."
        ),
    )
    pod_ips_per_node: int = Field(
        ge=1, description="Secondary IPs per NIC, one per pod (alias-IP networking)."
    )
    zones: list[Literal["1", "2", "3"]] = Field(
        default=["1"],
        min_length=1,
        description="Availability zones; scale sets are spread over them in turn.",
    )
    image: str = Field(
        default="Canonical:ubuntu-24_04-lts:server:latest",
        pattern=NODE_IMAGE_PATTERN,
        description="Marketplace image as publisher:offer:sku:version, or gallery:<major.minor.patch>: that "
        "version of the cluster's baked node image for the pool's kind.",
    )
    base_image: str | None = Field(
        default=None,
        pattern=r"^[^:\s]+:[^:\s]+:[^:\s]+:[^:\s]+$",
        description="Marketplace image (publisher:offer:sku:version) a bake of this pool's node image "
        "starts its builder VM from (superkube image capture). Default: the pool's image, when that is "
        "a marketplace image.",
    )
    os_disk_gb: int = Field(default=256, ge=64, le=4095, description="OS disk size in GiB.")
    labels: dict[str, str] = Field(default_factory=dict, description="Extra node labels.")
    taints: list[str] = Field(default_factory=list, description="Extra taints as key=value:Effect.")
    egress_limit: str | None = Field(
        default=None,
        description=(
            "Default egress limit of each pod on the pool's nodes, in bits/s as the pod annotation "
            "kubernetes.io/egress-bandwidth writes it (10M, 500M, 1G); a pod's own annotation wins. "
            "Off (unlimited) by default."
        ),
    )

    def template_labels(self, cluster: str) -> dict[str, str]:
        """The labels every node of the pool registers with that are known before it exists, and
        stay: what the autoscaler's node template can say, so what a node's team may depend on (the
        preflight label is left out: it changes when a node passes)."""
        return {CLUSTER_LABEL: cluster, POOL_LABEL: self.name, ROLE_LABEL: self.role, **self.labels}

    @field_validator("egress_limit", mode="before")
    @classmethod
    def _egress_limit(cls, v: Any) -> Any:
        if v is None:
            return v
        parse_rate(v)  # RateError is a ValueError: one line naming the key
        return str(v).strip()

    @property
    def egress_limit_bits(self) -> int | None:
        return parse_rate(self.egress_limit) if self.egress_limit else None

    @field_validator("zones", mode="before")
    @classmethod
    def _zones_as_strings(cls, v: Any) -> Any:
        return [str(z) for z in v] if isinstance(v, list) else v

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not _POOL.match(v):
            raise ValueError(
                f"{v!r} is not a pool name; use 1-12 characters a-z and 0-9, starting with a letter"
            )
        return v

    @field_validator("taints")
    @classmethod
    def _taints(cls, v: list[str]) -> list[str]:
        for taint in v:
            if not _TAINT.match(taint):
                raise ValueError(
                    f"{taint!r} is not a taint; write key=value:NoSchedule|PreferNoSchedule|NoExecute"
                )
            key = taint.partition("=")[0].partition(":")[0]
            if key in RESERVED_TAINT_KEYS:
                raise ValueError(
                    f"{taint!r}: {key} is set for you ({RESERVED_TAINT_KEYS[key]}); leave it out of taints"
                )
        return v

    @model_validator(mode="after")
    def _consistent(self) -> NodePool:
        if self.role == "gpu" and self.gpus_per_node < 1:
            raise ValueError(
                "gpus_per_node must be at least 1 for a gpu pool; set it to the VM size's GPU count"
            )
        if self.role == "cpu" and self.gpus_per_node:
            raise ValueError("gpus_per_node must be 0 for a cpu pool; set role: gpu or drop gpus_per_node")
        if self.min_nodes > self.nodes:
            raise ValueError(f"min_nodes {self.min_nodes} exceeds nodes {self.nodes}; lower min_nodes")
        return self


class PeeredSpoke(_Model):
    """Another cluster's spoke already peered to the hub (counted for overlaps and the hub's group)."""

    address_space: str
    ips: int = Field(ge=0, description="Private IPs that spoke uses (for the hub's peered-group limit).")

    @field_validator("address_space")
    @classmethod
    def _space(cls, v: str) -> str:
        return _cidr(v)


class LimitOverride(_Model):
    value: int = Field(ge=1)
    reason: str = Field(
        min_length=10, description="Why this stack may exceed Azure's default (quota ticket, ...)."
    )


class PolicyOverride(_Model):
    """A stack's decision to relax one policy rule, with the reason reviewers will see."""

    enforcement: Literal["advisory", "disabled"]
    reason: str = Field(
        min_length=10, description="Why this cluster may relax the rule; shown in every report."
    )


LimitName = Literal[
    "vnet_private_ips",
    "peered_group_private_ips",
    "nic_private_ips",
    "vnet_peerings",
    "vnet_subnets",
    "vmss_vms",
]

DEFAULT_NODE_POOLS = """\
- name: gpu
  role: gpu
  vm_size: Standard_ND96isr_H100_v5
  nodes: 4
  gpus_per_node: 8
  pod_ips_per_node: 15
  zones: ["1"]
  image: microsoft-dsvm:ubuntu-hpc:2204:latest
- name: cpu
  role: cpu
  vm_size: Standard_D16s_v5
  nodes: 3
  min_nodes: 1
  pod_ips_per_node: 30
  zones: ["1", "2", "3"]
"""


def _yaml_doc(key: str, value: Any, want: type) -> Any:
    """Parse a YAML-in-a-string config value (or pass through an already-structured one)."""
    if isinstance(value, str):
        try:
            value = strictyaml.load(value) if value.strip() else want()
        except strictyaml.DuplicateKeyError as exc:
            raise ValueError(
                f"{exc.message(of='the value')}; keep one of them (YAML would keep only the last)"
            ) from None
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f" at line {mark.line + 1}, column {mark.column + 1} of the value" if mark else ""
            problem = getattr(exc, "problem", None) or getattr(exc, "context", None)
            raise ValueError(f"is not valid YAML{where}" + (f" ({problem})" if problem else "")) from None
    if value is None:
        value = want()
    if not isinstance(value, want):
        raise ValueError(
            f"must be a YAML {'list' if want is list else 'mapping'}, got {type(value).__name__}"
        )
    return value


class ClusterSpec(_Model):
    """Every `superkube:` config key of a stack. Field order is the order of Pulumi.yaml."""

    cluster_name: str = Field(
        default="",
        description="Cluster name (a DNS label, at most 20 characters); empty means the stack name.",
    )
    region: str = Field(
        default="eastus",
        pattern=r"^[a-z0-9]+$",
        description="Azure region of every resource, e.g. eastus or southcentralus.",
    )
    environment: str = Field(
        default="dev",
        pattern=r"^[a-z][a-z0-9-]*$",
        description="Environment tag on every resource (dev, staging, prod, ...).",
    )
    team: str = Field(
        default="ml-infra",
        pattern=r"^[a-z][a-z0-9-]*$",
        description="Owning team; the owner tag on every resource.",
    )
    kubernetes_version: str = Field(
        default="1.35.0", pattern=r"^1\.\d+\.\d+$", description="Kubernetes version the nodes' kubelet runs."
    )
    admin_username: str = Field(
        default="superkube",
        pattern=r"^[a-z_][a-z0-9_-]{0,31}$",
        description="Admin user on every VM (SSH keys only; passwords are disabled).",
    )
    ssh_public_key: str = Field(
        default="", description="OpenSSH public key for admin_username on every VM (required)."
    )
    hub_address_space: str = Field(
        default="10.0.0.0/24", description="Hub VNet address space (NAT host and shared subnets)."
    )
    hub_shared_subnet_prefix: int = Field(
        default=26,
        ge=16,
        le=29,
        description="Prefix length of the hub's shared subnet, whose route table sends the service CIDR via the NAT host.",
    )
    spoke_address_space: str = Field(
        default="10.64.0.0/20",
        description="This cluster's spoke VNet address space: node and pod IPs, control plane, etcd.",
    )
    service_cidr: str = Field(
        default="10.128.0.0/16",
        description="Kubernetes service CIDR; reached from the hub through the NAT host.",
    )
    peered_spokes: dict[str, PeeredSpoke] = Field(
        default_factory=dict,
        description="YAML mapping: other clusters' spokes already peered to the hub, name -> {address_space, ips}.",
    )
    node_pools: list[NodePool] = Field(
        default=DEFAULT_NODE_POOLS,
        min_length=1,
        description="YAML list of node pools: name, role, vm_size, nodes, gpus_per_node, pod_ips_per_node, zones, ...",
        validate_default=True,
    )
    apiserver_count: int = Field(
        default=5,
        ge=1,
        le=15,
        description="Dedicated API-server VMs behind the internal load balancer (5; an odd count >= 3).",
    )
    apiserver_vm_size: str = Field(
        default="Standard_D16s_v5",
        pattern=r"^Standard_[A-Za-z0-9_]+$",
        description="VM size of the API servers.",
    )
    etcd_main_count: int = Field(
        default=5, ge=1, le=9, description="Members of the main etcd cluster (odd, >= 3)."
    )
    etcd_events_count: int = Field(
        default=5, ge=1, le=9, description="Members of the separate events etcd cluster (odd, >= 3)."
    )
    etcd_vm_size: str = Field(
        default="Standard_E8s_v5",
        pattern=r"^Standard_[A-Za-z0-9_]+$",
        description="VM size of every etcd member.",
    )
    etcd_disk_sku: str = Field(
        default="Premium_LRS",
        description="Managed disk SKU of the etcd data disk (Premium_LRS, PremiumV2_LRS, UltraSSD_LRS, Premium_ZRS).",
    )
    etcd_disk_gb: int = Field(
        default=256,
        ge=32,
        le=4095,
        description="Size of the etcd data disk in GiB (larger premium disks get more IOPS).",
    )
    control_plane_zones: list[Literal["1", "2", "3"]] = Field(
        default=["1", "2", "3"],
        description="Zones the API servers and etcd members are spread over in turn; empty for a region without zones.",
    )
    nat_host_vm_size: str = Field(
        default="Standard_D8s_v5",
        pattern=r"^Standard_[A-Za-z0-9_]+$",
        description="VM size of the NAT host in the hub.",
    )
    prometheus_shards: int = Field(
        default=2,
        ge=1,
        le=64,
        description=(
            "Prometheus servers sharing the scrape targets by hashmod of the address, one host each in the "
            "spoke's monitoring subnet; each remote-writes to the metrics store (superkube monitoring render)."
        ),
    )
    prometheus_vm_size: str = Field(
        default="Standard_E8s_v5",
        pattern=r"^Standard_[A-Za-z0-9_]+$",
        description="VM size of each Prometheus shard's host.",
    )
    prometheus_disk_gb: int = Field(
        default=256,
        ge=32,
        le=4095,
        description="Data disk of each Prometheus host in GiB: its own TSDB of recent samples (the store keeps the rest).",
    )
    metrics_store_count: int = Field(
        default=3,
        ge=2,
        le=32,
        description=(
            "Hosts of the metrics store, the cluster version of VictoriaMetrics (vminsert, vmselect and "
            "vmstorage on each; every sample is kept on 2 of them)."
        ),
    )
    metrics_store_vm_size: str = Field(
        default="Standard_E8s_v5",
        pattern=r"^Standard_[A-Za-z0-9_]+$",
        description="VM size of each metrics store host.",
    )
    metrics_store_disk_gb: int = Field(
        default=1024,
        ge=32,
        le=32767,
        description="Data disk of each metrics store host in GiB (vmstorage's data).",
    )
    metrics_store_url: str = Field(
        default="",
        pattern=r"^(https?://[^\s]+)?$",
        description=(
            "Remote-write URL of a Prometheus-compatible store elsewhere; empty (the default): each shard "
            "writes to this cluster's own store hosts (shard i to store host i mod metrics_store_count)."
        ),
    )
    health_max_cordoned_share: float = Field(
        default=0.05,
        gt=0,
        le=1,
        description=(
            "Share of a pool's nodes past preflight the health agent may cordon; past it the agent's "
            "breaker opens and it stops cordoning until a person looks (alert HealthAgentBreakerOpen)."
        ),
    )
    remediation_max_per_hour: int = Field(
        default=10,
        ge=0,
        le=1000,
        description=(
            "VMs remediation may delete in an hour (nodes health cordoned, drained or past their pool's "
            "deadline); 0: remediation does not run, and cordoned nodes stay until a person acts."
        ),
    )
    terminate_notice_minutes: int = Field(
        default=10,
        ge=5,
        le=15,
        description=(
            "Minutes Azure waits after telling a node's VM it will be deleted (the scale sets' terminate "
            "notification, 5 to 15): time for the health agents to have the node drained and approve it."
        ),
    )
    health_dry_run: bool = Field(
        default=False,
        description="The health agent logs the cordons and evictions it would make instead of making them.",
    )
    health_dcgm_exporter_url: str = Field(
        default="",
        pattern=r"^(https?://[^\s]+)?$",
        description=(
            "The node's dcgm-exporter /metrics URL, whose Xid and error counters the preflight and health "
            "agents read beside NVML ($(NODE_IP) is the node's address, e.g. http://$(NODE_IP):9400/metrics); "
            "empty: NVML only."
        ),
    )
    gpu_burn_seconds: int = Field(
        default=60,
        ge=0,
        le=3600,
        description=(
            "Seconds of the active GPU check (matrix-multiply burn, memory and PCIe bandwidth against the "
            "GPU model's expected figures) in preflight and in each periodic test; 0: the probe only."
        ),
    )
    gpu_test_schedule: str = Field(
        default="17 */6 * * *",
        pattern=r"^(|\S+ \S+ \S+ \S+ \S+)$",
        description=(
            "Cron schedule of the periodic GPU tests, a CronJob per GPU pool whose pods run only on nodes "
            "with every GPU idle, never preempt and never make the autoscaler add nodes; empty: no "
            "periodic tests."
        ),
    )
    gpu_test_nodes: int = Field(
        default=8,
        ge=1,
        le=1000,
        description="Idle nodes each periodic run tests per GPU pool, at most (one test pod per node).",
    )
    teams: list[TeamTuple] = Field(
        default_factory=list,
        description=(
            "YAML list of team capacity tuples {selector: {label: value}, team, priority}: matching nodes get "
            "the taint superkube.io/team=<team>:NoSchedule (highest priority wins); team any marks capacity "
            'pods may borrow with the label superkube.io/borrow: "true". Empty: no team taints, no webhook.'
        ),
    )
    autoscaler_enabled: bool = Field(
        default=True,
        description="Run cluster-autoscaler on the API-server hosts and tag every pool for its discovery (min/max and node templates).",
    )
    autoscaler_governor: bool = Field(
        default=True,
        description=(
            "Run the scale-up governor beside cluster-autoscaler: it raises each scale set's max tag a step at a "
            "time so a scale-up joins at most safe_join_rate_per_minute nodes a minute (the autoscaler has no "
            "rate limit of its own)."
        ),
    )
    autoscaler_join_jitter_seconds: int = Field(
        default=300,
        ge=0,
        le=3600,
        description="Each new node waits a random 0..N seconds before its kubelet registers, smoothing join bursts.",
    )
    autoscaler_max_nodes_per_scaleup: int = Field(
        default=50,
        ge=1,
        le=1000,
        description="Most nodes cluster-autoscaler adds in one scan; with the scan interval it bounds the join rate (upstream default 1000).",
    )
    autoscaler_scan_interval_seconds: int = Field(
        default=10,
        ge=1,
        le=600,
        description="How often cluster-autoscaler re-evaluates the cluster (upstream default 10).",
    )
    autoscaler_max_total_unready_percentage: int = Field(
        default=10,
        ge=1,
        le=100,
        description="cluster-autoscaler halts once more than this share of nodes is unready (upstream default 45).",
    )
    autoscaler_ok_total_unready_count: int = Field(
        default=50,
        ge=0,
        le=10_000,
        description="Unready nodes always tolerated before the percentage applies: room for a batch in flight (upstream default 3).",
    )
    autoscaler_new_pod_scale_up_delay_seconds: int = Field(
        default=30,
        ge=0,
        le=3600,
        description="Pods younger than this do not trigger scale-up, so a gang's pods arrive before nodes are asked for (upstream default 0).",
    )
    autoscaler_max_node_provision_minutes: int = Field(
        default=30,
        ge=5,
        le=240,
        description="How long a new node may take to become ready, boot and join jitter included (upstream default 15).",
    )
    autoscaler_max_nodes_total: int = Field(
        default=0,
        ge=0,
        le=100_000,
        description="Ceiling on the cluster's node count; 0 means the sum of the pools' nodes.",
    )
    safe_join_rate_per_minute: int = Field(
        default=300,
        ge=1,
        le=60_000,
        description="Most nodes per minute a full-pool scale-up may send to the API servers' join path (checked by policy).",
    )
    apf_node_join_shares: int = Field(
        default=1,
        ge=1,
        le=1000,
        description="nominalConcurrencyShares of the priority level that node bootstrap and registration requests queue in (1: a join storm keeps other clients' p99 within 2x; bench/join_flow.py).",
    )
    dns_replicas: int = Field(
        default=2,
        ge=2,
        le=1000,
        description="CoreDNS replicas serving cluster DNS, each on a node of its own (fewer on a stack of fewer nodes; docs/04-in-cluster-layer.md sizes them).",
    )
    in_cluster_layer: bool = Field(
        default=True,
        description="Deploy the in-cluster layer with this pulumi up; set false for a cluster's first pulumi up, before superkube converge has made its control plane.",
    )
    layer_only: bool = Field(
        default=False,
        description=(
            "Register the in-cluster layer alone, through a Kubernetes provider made from kubernetes:kubeconfig, "
            "and nothing of Azure: for a cluster whose machines exist already (the lab's API server; "
            "docs/04-in-cluster-layer.md). The join-token publisher is left out: it needs the scale sets."
        ),
    )
    kubernetes_await: bool = Field(
        default=True,
        description=(
            "The Kubernetes provider waits for each workload and Service of the layer to become ready; false: "
            "it does not (each object annotated pulumi.com/skipAwait), for an API server with no nodes, such "
            "as bench/pulumi_up.py's."
        ),
    )
    balloons_enabled: bool = Field(
        default=True,
        description=(
            "Balloon Deployments hold each pool's nodes (replicas: the pool's maximum); false: they exist "
            "at no replicas, for nodes that cannot hold a whole-node balloon, such as the lab's."
        ),
    )
    limit_overrides: dict[LimitName, LimitOverride] = Field(
        default_factory=dict,
        description="YAML mapping: Azure limit name -> {value, reason}, for quota raised by Azure support.",
    )
    policy_overrides: dict[str, PolicyOverride] = Field(
        default_factory=dict,
        description="YAML mapping: policy rule -> {enforcement: advisory|disabled, reason}, shown in every check report.",
    )

    @field_validator("node_pools", mode="before")
    @classmethod
    def _pools_yaml(cls, v: Any) -> Any:
        return _yaml_doc("node_pools", v, list)

    @field_validator("teams", mode="before")
    @classmethod
    def _teams_yaml(cls, v: Any) -> Any:
        return _yaml_doc("teams", v, list)

    @field_validator("teams")
    @classmethod
    def _teams_apply(cls, v: list[TeamTuple]) -> list[TeamTuple]:
        try:
            teams_check(v, "teams")
        except TeamsError as e:
            where, _, rest = str(e).partition(": ")
            head, _, fix = rest.partition("; ")
            raise SpecError(f"{NAMESPACE}:{where}", head, fix) from None
        return v

    @field_validator("control_plane_zones", mode="before")
    @classmethod
    def _zones_list(cls, v: Any) -> Any:
        items = _yaml_doc("", v, list)
        return [str(z) for z in items] if isinstance(items, list) else items

    @field_validator("peered_spokes", "limit_overrides", "policy_overrides", mode="before")
    @classmethod
    def _mapping_yaml(cls, v: Any) -> Any:
        return _yaml_doc("", v, dict)

    @field_validator("cluster_name")
    @classmethod
    def _cluster_name(cls, v: str) -> str:
        if v and not _LABEL.match(v):
            raise ValueError(
                f"{v!r} is not a cluster name; use 1-20 characters a-z, 0-9 and '-', starting with a letter"
            )
        return v

    @field_validator("region")
    @classmethod
    def _region(cls, v: str) -> str:
        known = azure_regions()
        if v not in known:
            close = difflib.get_close_matches(v, known, n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise ValueError(
                f"{v!r} is not an Azure region; {hint}write a region's programmatic name, e.g. eastus "
                f"(a region Azure opened since: add it to {REGIONS_FILE})"
            )
        return v

    @field_validator("hub_address_space", "spoke_address_space", "service_cidr")
    @classmethod
    def _cidrs(cls, v: str) -> str:
        return _cidr(v)

    @field_validator("ssh_public_key")
    @classmethod
    def _ssh_key(cls, v: str) -> str:
        if not v:
            raise ValueError(
                'is empty; set it to your team\'s OpenSSH public key (pulumi config set superkube:ssh_public_key "ssh-ed25519 AAAA...")'
            )
        if not _SSH_KEY.match(v):
            raise ValueError(
                "is not an OpenSSH public key; paste the one line of your id_ed25519.pub (ssh-ed25519 AAAA...)"
            )
        return v

    @field_validator("etcd_disk_sku")
    @classmethod
    def _disk_sku(cls, v: str) -> str:
        if v not in DISK_SKUS:
            raise ValueError(f"{v!r} is not a premium disk SKU; etcd needs one of {', '.join(DISK_SKUS)}")
        return v

    @field_validator("apiserver_count")
    @classmethod
    def _apiservers(cls, v: int) -> int:
        if not is_quorum_size(v):
            raise ValueError(
                f"must be an odd count >= 3 (got {v}); the design runs 5 API servers, set it to 5"
            )
        return v

    @field_validator("etcd_main_count", "etcd_events_count")
    @classmethod
    def _etcd(cls, v: int) -> int:
        if not is_quorum_size(v) and v % 2 == 0:
            raise ValueError(
                f"must be odd (got {v}): {v} members tolerate no more failures than {v - 1}; set it to {v - 1} or {v + 1}"
            )
        if v < 3:
            raise ValueError(
                f"must be at least 3 (got {v}): {v} member(s) tolerate no failure; set it to 3 or 5"
            )
        return v

    @model_validator(mode="after")
    def _pools_consistent(self) -> ClusterSpec:
        seen: set[str] = set()
        for i, pool in enumerate(self.node_pools):
            if pool.name in seen:
                raise SpecError(
                    f"{NAMESPACE}:node_pools[{i}].name",
                    f"pool name {pool.name!r} is used twice",
                    "give every pool its own name",
                )
            seen.add(pool.name)
        if not any(p.role == "gpu" for p in self.node_pools):
            raise SpecError(f"{NAMESPACE}:node_pools", "has no gpu pool", "add a pool with role: gpu")
        return self

    @model_validator(mode="after")
    def _every_team_can_own_nodes(self) -> ClusterSpec:
        """A tuple whose selector no pool's nodes can carry, and a team that owns no pool where a
        higher-priority tuple of `any` takes its nodes, are mistakes nothing would show later."""
        if not self.teams:
            return self
        labels = {p.name: self._decided_labels(p) for p in self.node_pools}
        for i, t in enumerate(self.teams):
            if not any(t.matches(ls) or t.undecided_by(ls) for ls in labels.values()):
                raise SpecError(
                    f"{NAMESPACE}:teams[{i}].selector",
                    f"{t.selector} matches no pool's nodes (a pool's nodes carry "
                    f"{POOL_LABEL}: <pool name>, {ROLE_LABEL}: gpu|cpu and the pool's labels)",
                    f"select labels a pool's nodes carry, e.g. {{{POOL_LABEL}: {self.node_pools[0].name}}}",
                )
        for i, t in enumerate(self.teams):
            if t.team == ANY or any(u.team == t.team for u in self.teams[:i]):
                continue  # a team is judged once, at its first tuple; `any` may yield all to teams
            owns = [n for n, ls in labels.items() if template_owner(self.teams, ls) == t.team]
            later = [
                n
                for n, ls in labels.items()
                if any(u.team == t.team and u.undecided_by(ls) for u in self.teams)
            ]
            if owns or later:
                continue
            pool = next(n for n, ls in labels.items() if t.matches(ls))
            winner = next(u for u in sorted(self.teams, key=lambda u: -u.priority) if u.matches(labels[pool]))
            raise SpecError(
                f"{NAMESPACE}:teams[{i}]",
                f"team {t.team!r} owns no node: pool {pool}'s nodes go to {winner.team!r} "
                f"(priority {winner.priority}, over {t.priority})",
                f"give {t.team}'s tuple a priority above {winner.priority}, or select other nodes",
            )
        return self

    def _decided_labels(self, pool: NodePool) -> dict[str, str]:
        """A pool's template labels as far as the spec alone decides them: the cluster's label only
        when superkube:cluster_name names it (else the stack does, which the spec does not know)."""
        labels = pool.template_labels(self.cluster_name)
        if not self.cluster_name:
            del labels[CLUSTER_LABEL]
        return labels

    @model_validator(mode="after")
    def _layer_only_has_layer(self) -> ClusterSpec:
        if self.layer_only and not self.in_cluster_layer:
            raise SpecError(
                f"{NAMESPACE}:layer_only",
                "is true but in_cluster_layer is false, which leaves nothing to register",
                "set superkube:in_cluster_layer true, or layer_only false",
            )
        return self

    def pool_team(self, pool: NodePool, cluster: str) -> str | None:
        """The team whose taint the pool's nodes register with, and the autoscaler's template of them
        carries (None: no team taint): the owner by the tuples the pool's template labels decide. A
        tuple on a label the pool does not carry (a rack label put on nodes later) is left out; the
        team reconciler applies it once a node has that label, and for such nodes the template and
        the node then differ."""
        return template_owner(self.teams, pool.template_labels(cluster))

    def team_pools(self, cluster: str) -> dict[str, str]:
        """Pool -> the team its nodes register as (by the tuples its template decides): the team's
        name, `any`, or "" for nodes of no team (anyone's)."""
        return {p.name: self.pool_team(p, cluster) or "" for p in self.node_pools}

    def later_teams(self, pool: NodePool, cluster: str) -> list[str]:
        """Teams whose tuples on labels a node gets after it registers (a rack) may take some of the
        pool's nodes: what the plan cannot decide."""
        labels = pool.template_labels(cluster)
        return sorted({t.team for t in self.teams if t.undecided_by(labels)})

    def name(self, stack: str) -> str:
        """The cluster's name: superkube:cluster_name, or else the stack's name, which must then
        be a cluster name too (it names every resource and the VMs' computer names)."""
        if self.cluster_name:
            return self.cluster_name
        if not _LABEL.match(stack):
            raise SpecError(
                f"{NAMESPACE}:cluster_name",
                f"is not set, so the stack's name {stack!r} names the cluster, and it is not a cluster name "
                "(1-20 characters a-z, 0-9 and '-', starting with a letter)",
                "set one: pulumi config set superkube:cluster_name gpu-west",
            )
        return stack


CONFIG_KEYS: tuple[str, ...] = tuple(ClusterSpec.model_fields)
YAML_KEYS = frozenset({"node_pools", "peered_spokes", "limit_overrides", "policy_overrides", "teams"})
ARRAY_KEYS = frozenset({"control_plane_zones"})


def _key_path(loc: tuple[int | str, ...]) -> str:
    out = NAMESPACE + ":"
    for i, part in enumerate(loc):
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if i else "") + str(part)
    return out


# Every pattern a key must match, said in words (an error shows the pattern too).
PATTERN_WORDS = {
    r"^[0-9./]+$": "write an IPv4 CIDR such as 10.64.0.0/20",
    r"^Standard_[A-Za-z0-9_]+$": "write an Azure VM size as Azure spells it, e.g. Standard_D8s_v5 (capital S)",
    r"^[^:\s]+:[^:\s]+:[^:\s]+:[^:\s]+$": "write a marketplace image as publisher:offer:sku:version",
    NODE_IMAGE_PATTERN: "write a marketplace image as publisher:offer:sku:version, or gallery:1.0.0 for a version "
    "of the cluster's baked node image",
    r"^[a-z0-9]+$": "write the region's name in lower-case letters and digits, e.g. eastus",
    r"^[a-z][a-z0-9-]*$": "write a lower-case name: a letter, then letters, digits or '-'",
    r"^1\.\d+\.\d+$": "write a Kubernetes version such as 1.35.0",
    r"^[a-z_][a-z0-9_-]{0,31}$": "write a Linux user name: lower-case letters, digits, '_' or '-', at most 32",
    r"^(https?://[^\s]+)?$": "write an http:// or https:// URL without spaces, e.g. http://vminsert:8480/insert/0/prometheus/api/v1/write",
    r"^(|\S+ \S+ \S+ \S+ \S+)$": "write a cron schedule of five fields, e.g. '17 */6 * * *', or '' for none",
}


def _fix_for(err: Mapping[str, Any], known: list[str]) -> str:
    kind = err["type"]
    loc = err["loc"]
    if kind == "extra_forbidden":
        close = difflib.get_close_matches(str(loc[-1]), known, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        return f"{hint}remove it or use one of: {', '.join(known)}"
    if kind == "missing":
        return "add it"
    if kind.startswith("int_"):
        return "write a whole number"
    if kind.startswith("bool"):
        return "write true or false"
    if kind in ("greater_than_equal", "less_than_equal", "greater_than", "less_than"):
        return "choose a value within that range"
    if kind == "string_pattern_mismatch":
        pattern = (err.get("ctx") or {}).get("pattern", "")
        return PATTERN_WORDS.get(pattern, "match the documented format (see Pulumi.yaml)")
    if kind == "literal_error":
        return "use one of the allowed values"
    if kind in ("list_type", "dict_type", "model_type"):
        return "fix the YAML structure (see Pulumi.yaml for an example)"
    return "see the key's description in Pulumi.yaml"


def _known_keys(loc: tuple[int | str, ...]) -> list[str]:
    model: type[BaseModel] = ClusterSpec
    if loc and loc[0] == "node_pools":
        model = NodePool
    elif loc and loc[0] == "peered_spokes":
        model = PeeredSpoke
    elif loc and loc[0] == "limit_overrides":
        model = LimitOverride
    elif loc and loc[0] == "policy_overrides":
        model = PolicyOverride
    elif loc and loc[0] == "teams":
        model = TeamTuple
    return list(model.model_fields)


def _uncapitalized(message: str) -> str:
    """pydantic's message with its first letter lowered, and nothing else (patterns stay verbatim)."""
    return message[:1].lower() + message[1:]


def from_config(config: Mapping[str, Any]) -> ClusterSpec:
    """Validate un-namespaced config values (strings as Pulumi passes them, or YAML scalars)."""
    values: dict[str, Any] = {}
    for key, value in config.items():
        values[key] = value
    try:
        return ClusterSpec.model_validate(values)
    except SpecError:
        raise
    except ValidationError as exc:
        # an unknown key first: a misspelt key is why the right one is missing
        err = sorted(exc.errors(include_url=False), key=lambda e: e["type"] != "extra_forbidden")[0]
        loc = tuple(err["loc"])
        if loc and loc[-1] == "[key]":  # a bad mapping key, e.g. an unknown limit name
            loc = loc[:-1]
            problem = f"{err['input']!r} is not allowed here ({_uncapitalized(err['msg'])})"
        else:
            problem = str(err["msg"]).removeprefix("Value error, ")
            if err["type"] == "extra_forbidden":
                problem = "unknown key"
            elif err["type"] == "missing":
                problem = "is required"
            elif (
                err["type"] not in ("value_error", "assertion_error")
                and "input" in err
                and not isinstance(err["input"], dict | list)
            ):
                problem = f"{_uncapitalized(problem)} (got {err['input']!r})"
        if ";" in problem:  # our own validators already say how to fix it
            head, _, fix = problem.partition("; ")
            raise SpecError(_key_path(loc), head, fix) from None
        raise SpecError(_key_path(loc), problem, _fix_for(err, _known_keys(loc))) from None
