"""superkube: one GPU Kubernetes cluster on Azure per stack (`pulumi up -s <cluster>`).

Thin on purpose: validate the stack's config once, plan its addresses, build the Cluster component.
`superkube plan` runs this same file under Pulumi's mock engine.
"""

import pulumi

from modules.cluster import Cluster, ClusterArgs
from superkube.ipam import plan_addresses
from superkube.spec import CONFIG_KEYS, NAMESPACE, SpecError, from_config

config = pulumi.Config(NAMESPACE)
values = {key: config.get(key) for key in CONFIG_KEYS}
try:
    spec = from_config({k: v for k, v in values.items() if v is not None})
    plan = plan_addresses(spec, pulumi.get_stack())
except SpecError as error:
    raise pulumi.RunError(str(error)) from None

cluster = Cluster(plan.cluster, ClusterArgs(spec=spec, plan=plan))
for key, value in cluster.outputs.items():
    pulumi.export(key, value)
