"""Production's roles know nothing of the lab: the lab's inventory sets what differs there
(superkube.lab.inventory.LAB_ROLE_VARS), each value over a default a role really has."""

from __future__ import annotations

import yaml

from superkube.lab.inventory import LAB_ROLE_VARS
from tests.conftest import ROOT

PLAYBOOKS = ROOT / "playbooks"


def test_no_role_or_playbook_asks_whether_it_runs_on_the_lab() -> None:
    found = [
        f"{path.relative_to(ROOT)}:{number}"
        for path in sorted(PLAYBOOKS.rglob("*"))
        if path.is_file() and path.suffix in (".yml", ".yaml", ".j2", ".py", ".cfg")
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if "superkube_lab" in line or "_lab_" in line
    ]
    assert found == [], found


def test_every_value_the_lab_sets_is_over_a_role_default_of_that_name() -> None:
    defaults: dict[str, object] = {}
    for path in sorted(PLAYBOOKS.glob("roles/*/defaults/main.yml")):
        defaults.update(yaml.safe_load(path.read_text()) or {})
    missing = sorted(set(LAB_ROLE_VARS) - set(defaults))
    assert missing == [], f"the lab sets variables no role has: {missing}"
    same = sorted(k for k, v in LAB_ROLE_VARS.items() if defaults[k] == v)
    assert same == [], f"the lab sets what production already has: {same}"


def test_the_jobs_the_lab_runs_and_leaves_out_are_the_clusters_jobs() -> None:
    """The scrape jobs the lab names (before the cluster's credentials are placed, and the ones it
    never runs) are jobs of the generated configuration: a renamed job fails here, not silently."""
    from superkube.cluster import monitoring
    from superkube.lab.inventory import LAB_HOST_JOBS, LAB_SKIPPED_JOBS

    jobs = {job.name for job in monitoring.jobs()}
    assert set(LAB_HOST_JOBS) <= jobs, set(LAB_HOST_JOBS) - jobs
    assert set(LAB_SKIPPED_JOBS) <= jobs, set(LAB_SKIPPED_JOBS) - jobs
    assert not set(LAB_HOST_JOBS) & set(LAB_SKIPPED_JOBS)
