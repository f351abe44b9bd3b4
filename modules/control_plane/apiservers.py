"""Dedicated API-server VMs behind an internal Standard load balancer."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import pulumi
from pulumi_azure_native import network

from modules.common import child, require, tagged
from modules.compute.machine import members, placement
from superkube.cluster.kube import APISERVER_LB_ALL_DOWN_SENDS_TO_ALL as ALL_DOWN_SENDS_TO_ALL
from superkube.cluster.kube import APISERVER_LB_IDLE_TIMEOUT_MIN as IDLE_TIMEOUT_MIN
from superkube.cluster.kube import APISERVER_PORT as API_PORT
from superkube.cluster.kube import APISERVER_PROBE_INTERVAL_S as PROBE_INTERVAL_S
from superkube.cluster.kube import APISERVER_PROBE_PATH as PROBE_PATH
from superkube.cluster.kube import APISERVER_PROBE_THRESHOLD as PROBE_THRESHOLD
from superkube.cluster.kube import APISERVERS


@dataclass(frozen=True, kw_only=True)
class ApiServersArgs:
    cluster: str
    """Cluster name, used in Azure resource names."""
    location: str
    """Azure region."""
    subscription_id: pulumi.Input[str]
    """Subscription of the load balancer, to build its sub-resource IDs."""
    resource_group_name: str
    """Resource group of the cluster (a plain name: it is part of the load balancer's ID)."""
    subnet_id: pulumi.Input[str]
    """The apiservers subnet."""
    frontend_ip: str
    """Static IP of the load balancer's internal frontend."""
    member_ips: Sequence[str]
    """Static IPs of the API servers; their count is the API-server count."""
    vm_size: str
    """Azure VM size of every API server."""
    admin_username: str
    """Admin user; login by SSH key only."""
    ssh_public_key: str
    """OpenSSH public key of the admin user."""
    zones: Sequence[str] = ()
    """Zones the API servers are spread over in turn (default: none, regional)."""
    tags: dict[str, str] = field(default_factory=dict)
    """Tags on every resource (default: none)."""
    identity_ids: Sequence[pulumi.Input[str]] = ()
    """Resource IDs of the identities the host services act as on these hosts: cluster-autoscaler's
    and remediation's (default: none)."""
    autoscaler_tags: Mapping[str, pulumi.Input[str]] = field(default_factory=dict)
    """Tags on the VMs that tell the host services those identities and their scope
    (superkube.cluster.autoscaling's IDENTITY_TAG and SCOPE_TAG, superkube.cluster.remediation's
    IDENTITY_TAG; default: none)."""

    def __post_init__(self) -> None:
        n = len(self.member_ips)
        require(
            n >= 3 and n % 2 == 1,
            "member_ips",
            f"run an odd count >= 3 of API servers (5 by design), got {n}",
        )
        require(self.frontend_ip not in self.member_ips, "frontend_ip", "must differ from every member IP")


class ApiServers(pulumi.ComponentResource):
    """The internal load balancer (TCP 6443, probed on /readyz) and one VM per API server."""

    def __init__(self, name: str, args: ApiServersArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("superkube:control_plane:ApiServers", name, None, opts)
        lb_name = f"lbi-{args.cluster}-apiserver"
        lb_id = pulumi.Output.concat(
            "/subscriptions/",
            args.subscription_id,
            f"/resourceGroups/{args.resource_group_name}/providers/Microsoft.Network/loadBalancers/{lb_name}",
        )
        frontend_id = pulumi.Output.concat(lb_id, "/frontendIPConfigurations/apiserver")
        pool_id = pulumi.Output.concat(lb_id, "/backendAddressPools/apiservers")
        probe_id = pulumi.Output.concat(lb_id, "/probes/apiserver-readyz")
        tags = tagged(args.tags, superkube_role=APISERVERS)
        self.load_balancer = network.LoadBalancer(
            f"{name}-lb",
            load_balancer_name=lb_name,
            resource_group_name=args.resource_group_name,
            location=args.location,
            sku={"name": "Standard", "tier": "Regional"},
            frontend_ip_configurations=[
                {
                    "name": "apiserver",
                    "subnet": {"id": args.subnet_id},
                    "private_ip_allocation_method": "Static",
                    "private_ip_address": args.frontend_ip,
                    "zones": list(args.zones) or None,
                }
            ],
            backend_address_pools=[{"name": "apiservers"}],
            probes=[
                {
                    "name": "apiserver-readyz",
                    "protocol": "Https",
                    "port": API_PORT,
                    "request_path": PROBE_PATH,
                    "interval_in_seconds": PROBE_INTERVAL_S,
                    "probe_threshold": PROBE_THRESHOLD,
                    "no_healthy_backends_behavior": "AllProbedUp"
                    if ALL_DOWN_SENDS_TO_ALL
                    else "AllProbedDown",
                }
            ],
            load_balancing_rules=[
                {
                    "name": "apiserver",
                    "protocol": "Tcp",
                    "frontend_port": API_PORT,
                    "backend_port": API_PORT,
                    "frontend_ip_configuration": {"id": frontend_id},
                    "backend_address_pool": {"id": pool_id},
                    "probe": {"id": probe_id},
                    "idle_timeout_in_minutes": IDLE_TIMEOUT_MIN,
                    "enable_tcp_reset": True,
                    "disable_outbound_snat": True,
                }
            ],
            tags=tags,
            opts=child(self),
        )
        self.members = members(
            self,
            name,
            vm_prefix=f"apiserver-{args.cluster}",
            member_ips=args.member_ips,
            zones=args.zones,
            **placement(args),
            backend_pool_ids=[pool_id],
            depends_on=[self.load_balancer],
            tags={**tags, **args.autoscaler_tags},
            identity_ids=args.identity_ids,
        )
        self.endpoint = f"https://{args.frontend_ip}:{API_PORT}"
        self.register_outputs({"endpoint": self.endpoint, "load_balancer_id": self.load_balancer.id})
