"""Every rule, in report order. Importing this never starts a policy server."""

from policies.rules import compute, hygiene, jobs, monitoring, network, platform, topology, wiring

ALL_RULES = [
    *topology.RULES,
    *network.RULES,
    *compute.RULES,
    *hygiene.RULES,
    *wiring.RULES,
    *platform.RULES,
    *monitoring.RULES,
    *jobs.RULES,
]
