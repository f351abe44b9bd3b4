"""The CrossGuard PolicyPack: every rule in policies/rules as a stack validation policy.

Constructing a PolicyPack starts the policy server, so only the Pulumi CLI runs this file;
tests and `superkube check` import policies.rules instead. Per-stack settings (limits, the
configured API-server count, rules a stack relaxes) come from the policy-pack config that
`superkube policy-config --stack <name>` writes for `--policy-pack-config`.
"""

import sys
from pathlib import Path

from pulumi_policy import EnforcementLevel, PolicyPack

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from policies.crossguard import to_policy
from policies.rules import ALL_RULES

PolicyPack(
    name="superkube",
    enforcement_level=EnforcementLevel.MANDATORY,
    policies=[to_policy(rule) for rule in ALL_RULES],
)
