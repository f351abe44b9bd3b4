"""superkube: one GPU Kubernetes cluster on Azure per stack (`pulumi up -s <cluster>`).

Thin on purpose: validate the stack's config, plan its addresses, build the Cluster component (or,
with superkube:layer_only, the in-cluster layer alone against an existing cluster's kubeconfig).
`superkube plan` runs this same file under Pulumi's mock engine, after it has validated the same
config strings itself (to refuse a bad stack before the program starts); the program validates them
again because under `pulumi up` nothing did before it.
"""

import pulumi

from modules.cluster import Cluster, ClusterArgs
from modules.platform.layer import InClusterLayer, InClusterLayerArgs
from superkube.cluster.kube import APISERVER_PORT
from superkube.model import vmsizes
from superkube.model.ipam import plan_addresses
from superkube.model.spec import CONFIG_KEYS, KUBECONFIG_KEY, NAMESPACE, SpecError, from_config
from superkube.model.teams import WEBHOOK_TLS_KEY

config = pulumi.Config(NAMESPACE)
values = {key: config.get(key) for key in CONFIG_KEYS}
try:
    spec = from_config({k: v for k, v in values.items() if v is not None})
    plan = plan_addresses(spec, pulumi.get_stack())
    vmsizes.check(spec)
except SpecError as error:
    raise pulumi.RunError(str(error)) from None

# The in-cluster layer talks to the cluster as its admin: `superkube converge` writes the kubeconfig
# (pki/admin.kubeconfig beside the inventory), then `pulumi config set --secret kubernetes:kubeconfig`.
namespace, _, key = KUBECONFIG_KEY.partition(":")
kubeconfig = pulumi.Config(namespace).get_secret(key)
if spec.in_cluster_layer and kubeconfig is None:
    raise pulumi.RunError(
        f"{KUBECONFIG_KEY} is not set, and the in-cluster layer needs it: for a cluster's first "
        f"pulumi up set superkube:in_cluster_layer false (pulumi config set superkube:in_cluster_layer false "
        f"-s {pulumi.get_stack()}); after superkube converge run pulumi config set --secret "
        f"{KUBECONFIG_KEY} -s {pulumi.get_stack()} < <inventory dir>/pki/admin.kubeconfig"
    )
# The team webhook's certificate, key and CA: converge writes them as pki/team-webhook.pem.
tls_namespace, _, tls_key = WEBHOOK_TLS_KEY.partition(":")
webhook_tls = pulumi.Config(tls_namespace).get_secret(tls_key)
if spec.in_cluster_layer and spec.teams and webhook_tls is None:
    raise pulumi.RunError(
        f"{WEBHOOK_TLS_KEY} is not set, and the team webhook (superkube:teams is not empty) needs it: "
        f"after superkube converge run pulumi config set --secret {WEBHOOK_TLS_KEY} -s {pulumi.get_stack()} "
        "< <inventory dir>/pki/team-webhook.pem"
    )
if spec.layer_only:
    # The in-cluster layer alone, against the cluster in kubernetes:kubeconfig: no Azure provider, no
    # Azure resource. Named as the full program names it, so its objects' names are the same.
    assert kubeconfig is not None  # checked above: layer_only needs in_cluster_layer
    layer = InClusterLayer(
        f"{plan.cluster}-in-cluster",
        InClusterLayerArgs(
            spec=spec,
            cluster=plan.cluster,
            kubeconfig=kubeconfig,
            team_webhook_tls=webhook_tls,
            apiserver_address=f"{plan.apiserver_lb_ip}:{APISERVER_PORT}",
            await_ready=spec.kubernetes_await,
        ),
    )
    pulumi.export("in_cluster_components", layer.components)
else:
    cluster = Cluster(
        plan.cluster, ClusterArgs(spec=spec, plan=plan, kubeconfig=kubeconfig, team_webhook_tls=webhook_tls)
    )
    for key, value in cluster.outputs.items():
        pulumi.export(key, value)
