"""The roles rendered offline over the flagship's plan and inventory, for the tests of this folder."""

from __future__ import annotations

import pytest

from superkube.cluster import inventory, wiring
from superkube.plan import checks
from superkube.plan.engine import Plan


@pytest.fixture(scope="module")
def engine(flagship_plan: Plan) -> wiring.Wiring:
    """The flagship's hosts as the plan records them, over the inventory `superkube inventory` writes."""
    view = checks.StackView(
        checks.PlanResource(r.urn, r.type, r.name, r.inputs, r.parent, tuple(r.dependencies))
        for r in flagship_plan.resources
    )
    return wiring.Wiring(
        wiring.plan_hosts(view.resources), inventory.azure_rm(flagship_plan.spec, flagship_plan.addresses)
    )
