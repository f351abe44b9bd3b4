"""Every rule, in report order. Importing this never starts a policy server."""

from policies.rules import compute, hygiene, iam, jobs, monitoring, network, platform, topology, wiring

ALL_RULES = [
    *topology.RULES,
    *network.RULES,
    *compute.RULES,
    *iam.RULES,
    *hygiene.RULES,
    *wiring.RULES,
    *platform.RULES,
    *monitoring.RULES,
    *jobs.RULES,
]
