"""The roles rendered offline over the flagship's plan and inventory, for the tests of this folder."""

from __future__ import annotations

import pytest

from superkube.cluster import wiring
from superkube.plan import checks
from superkube.plan.engine import Plan


@pytest.fixture(scope="module")
def engine(flagship_plan: Plan) -> wiring.Wiring:
    """The flagship's hosts as the plan records them, over the inventory `superkube inventory` writes."""
    return checks.plan_wiring(flagship_plan)
