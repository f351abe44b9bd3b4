"""Malformed specs: one line naming the key and the fix, exit 2, no traceback, nothing written."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from superkube.cli import app
from tests.conftest import ROOT, dev_config

DEV_POOLS = yaml.safe_load(dev_config()["superkube:node_pools"])


def pools(**changes: Any) -> str:
    """The dev node pools with the first pool changed."""
    first = {**DEV_POOLS[0], **changes}
    return yaml.safe_dump([first, *DEV_POOLS[1:]], sort_keys=False)


def big_gpu_pool(nodes: int, pod_ips: int) -> str:
    return pools(nodes=nodes, pod_ips_per_node=pod_ips)


CASES: list[tuple[str, dict[str, Any], str, str]] = [
    # (case id, config changes, key named in the message, a word of the problem)
    (
        "overlapping-vnets",
        {"spoke_address_space": "10.0.0.0/16"},
        "superkube:spoke_address_space",
        "overlaps",
    ),
    ("service-cidr-overlaps-spoke", {"service_cidr": "10.64.0.0/16"}, "superkube:service_cidr", "overlaps"),
    ("even-etcd", {"etcd_main_count": 4}, "superkube:etcd_main_count", "odd"),
    ("one-events-member", {"etcd_events_count": 1}, "superkube:etcd_events_count", "at least 3"),
    ("four-apiservers", {"apiserver_count": 4}, "superkube:apiserver_count", "odd"),
    (
        "300-pod-ips",
        {"node_pools": pools(pod_ips_per_node=300)},
        "superkube:node_pools[0].pod_ips_per_node",
        "256",
    ),
    (
        "egress-limit-in-bytes-words",
        {"node_pools": pools(egress_limit="10Mbps")},
        "superkube:node_pools[0].egress_limit",
        "not a rate",
    ),
    (
        "egress-limit-milli",
        {"node_pools": pools(egress_limit="100m")},
        "superkube:node_pools[0].egress_limit",
        "write M for mega",
    ),
    (
        "egress-limit-too-small",
        {"node_pools": pools(egress_limit="10")},
        "superkube:node_pools[0].egress_limit",
        "1k to 1P",
    ),
    ("store-url-not-a-url", {"metrics_store_url": "vminsert:8480"}, "superkube:metrics_store_url", "URL"),
    ("no-prometheus", {"prometheus_shards": 0}, "superkube:prometheus_shards", "1"),
    ("one-store-host", {"metrics_store_count": 1}, "superkube:metrics_store_count", "2"),
    ("breaker-above-all", {"health_max_cordoned_share": 1.5}, "superkube:health_max_cordoned_share", "1"),
    ("share-as-word", {"health_max_cordoned_share": "some"}, "superkube:health_max_cordoned_share", "number"),
    ("region-as-list", {"region": ["eastus"]}, "superkube:region", "must be a string, got a YAML list"),
    ("unknown-key", {"colour": "blue"}, "superkube:colour", "unknown key"),
    (
        "schedule-of-four-fields",
        {"gpu_test_schedule": "0 */6 * *"},
        "superkube:gpu_test_schedule",
        "five fields",
    ),
    ("burn-for-hours", {"gpu_burn_seconds": 7200}, "superkube:gpu_burn_seconds", "3600"),
    (
        "two-teams-one-pool-one-priority",
        {
            "teams": "- {selector: {superkube.io/pool: gpu}, team: a}\n- {selector: {superkube.io/pool: gpu}, team: b}\n"
        },
        "superkube:teams[1]",
        "same priority",
    ),
    (
        "team-not-a-label",
        {"teams": "- {selector: {superkube.io/pool: gpu}, team: Research}\n"},
        "superkube:teams[0].team",
        "DNS label",
    ),
    (
        "team-without-selector",
        {"teams": "- {selector: {}, team: research}\n"},
        "superkube:teams[0].selector",
        "at least 1",
    ),
    ("teams-as-mapping", {"teams": "research: gpu\n"}, "superkube:teams", "YAML list"),
    (
        "unknown-pool-key",
        {"node_pools": pools(gpu_count=8)},
        "superkube:node_pools[0].gpu_count",
        "unknown key",
    ),
    ("int-as-word", {"apiserver_count": "five"}, "superkube:apiserver_count", "integer"),
    ("bool-as-word", {"autoscaler_enabled": "maybe"}, "superkube:autoscaler_enabled", "boolean"),
    (
        "vnet-over-ip-limit",
        {"spoke_address_space": "10.64.0.0/12", "node_pools": big_gpu_pool(7_500, 26)},
        "superkube:node_pools[0].pod_ips_per_node",
        "65,536",
    ),
    (
        "peered-group-over-limit",
        {
            "spoke_address_space": "10.64.0.0/12",
            "node_pools": big_gpu_pool(7_500, 17),
            "limit_overrides": "vnet_private_ips: {value: 200000, reason: 'raised by support ticket 1234'}\n",
        },
        "superkube:node_pools[0].pod_ips_per_node",
        "128,000",
    ),
    (
        "override-without-reason",
        {"limit_overrides": "vmss_vms: {value: 2000}\n"},
        "superkube:limit_overrides.vmss_vms.reason",
        "required",
    ),
    (
        "override-unknown-limit",
        {"limit_overrides": "vms_per_set: {value: 2000, reason: 'a long enough reason'}\n"},
        "superkube:limit_overrides.vms_per_set",
        "not allowed",
    ),
    ("cidr-host-bits", {"hub_address_space": "10.0.0.1/24"}, "superkube:hub_address_space", "host bits"),
    ("public-range", {"spoke_address_space": "8.8.0.0/16"}, "superkube:spoke_address_space", "private"),
    ("pools-as-structure", {"node_pools": DEV_POOLS}, "superkube:node_pools", "string"),
    ("pools-bad-yaml", {"node_pools": "- name: gpu\n  role: [gpu\n"}, "superkube:node_pools", "YAML"),
    (
        "gpu-pool-without-gpus",
        {"node_pools": pools(gpus_per_node=0)},
        "superkube:node_pools[0]",
        "gpus_per_node",
    ),
    (
        "cpu-pool-with-gpus",
        {"node_pools": yaml.safe_dump([DEV_POOLS[0], {**DEV_POOLS[1], "gpus_per_node": 8}])},
        "superkube:node_pools[1]",
        "gpus_per_node",
    ),
    (
        "duplicate-pool-names",
        {"node_pools": yaml.safe_dump([DEV_POOLS[0], {**DEV_POOLS[1], "name": "gpu"}])},
        "superkube:node_pools[1].name",
        "twice",
    ),
    ("no-gpu-pool", {"node_pools": yaml.safe_dump([DEV_POOLS[1]])}, "superkube:node_pools", "no gpu pool"),
    ("empty-ssh-key", {"ssh_public_key": ""}, "superkube:ssh_public_key", "empty"),
    ("password-not-key", {"ssh_public_key": "hunter2"}, "superkube:ssh_public_key", "OpenSSH"),
    ("standard-etcd-disk", {"etcd_disk_sku": "Standard_LRS"}, "superkube:etcd_disk_sku", "premium"),
    (
        "spoke-too-small",
        {"spoke_address_space": "10.64.0.0/26"},
        "superkube:spoke_address_space",
        "cannot hold",
    ),
    ("zone-4", {"node_pools": pools(zones=["4"])}, "superkube:node_pools[0].zones[0]", "'1'"),
    ("bad-taint", {"node_pools": pools(taints=["gpu=true"])}, "superkube:node_pools[0].taints", "taint"),
    (
        # the plan gives a pool its team's taint; a second of one key and effect fails registration
        "team-taint-by-hand",
        {"node_pools": pools(taints=["superkube.io/team=research:NoSchedule"])},
        "superkube:node_pools[0].taints",
        "comes from superkube:teams",
    ),
    ("bad-cluster-name", {"cluster_name": "Bad_Name"}, "superkube:cluster_name", "cluster name"),
    ("min-over-max", {"node_pools": pools(min_nodes=10)}, "superkube:node_pools[0]", "min_nodes"),
    ("pool-name-uppercase", {"node_pools": pools(name="GPU")}, "superkube:node_pools[0].name", "pool name"),
    (
        "peer-overlaps-spoke",
        {"peered_spokes": "other: {address_space: 10.64.0.0/16, ips: 10}\n"},
        "superkube:peered_spokes.other.address_space",
        "overlaps",
    ),
    ("region-with-space", {"region": "East US"}, "superkube:region", "pattern"),
    ("zones-not-a-list", {"control_plane_zones": "1"}, "superkube:control_plane_zones", "list"),
    (
        "negative-nodes",
        {"node_pools": pools(nodes=-3)},
        "superkube:node_pools[0].nodes",
        "greater than or equal",
    ),
    ("vm-size-format", {"etcd_vm_size": "E8s"}, "superkube:etcd_vm_size", "pattern"),
]


def run_cli(args: list[str]) -> Any:
    return CliRunner().invoke(app, args)


@pytest.mark.parametrize(("changes", "key", "word"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_spec_gives_one_line_naming_the_key(
    changes: dict[str, Any], key: str, word: str, write_stack: Callable[..., Path], tmp_path: Path
) -> None:
    config = {**dev_config(), **{f"superkube:{k}": v for k, v in changes.items()}}
    stack = write_stack(config)
    out_json, svg = tmp_path / "plan.json", tmp_path / "topology.svg"
    result = run_cli(["plan", "--stack", str(stack), "--out", str(out_json), "--diagram", str(svg)])
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == 2, result.output
    assert len(lines) == 1, lines
    assert f"{key}:" in lines[0] or f"{key} " in lines[0], lines[0]
    assert word.lower() in lines[0].lower(), lines[0]
    assert "; " in lines[0], "the line says how to fix it"
    assert "Traceback" not in result.output
    assert result.stdout == ""
    assert not out_json.exists() and not svg.exists()


PATTERN_CASES = [
    ("region", "East US", "'^[a-z0-9]+$'", "lower-case letters and digits, e.g. eastus"),
    ("nat_host_vm_size", "standard_d2s_v5", "'^Standard_[A-Za-z0-9_]+$'", "e.g. Standard_D8s_v5 (capital S)"),
    ("kubernetes_version", "v1.35", "'^1\\.\\d+\\.\\d+$'", "such as 1.35.0"),
    ("team", "ML_Infra", "'^[a-z][a-z0-9-]*$'", "a letter, then letters, digits or '-'"),
]


@pytest.mark.parametrize(
    ("key", "value", "pattern", "words"), PATTERN_CASES, ids=[c[0] for c in PATTERN_CASES]
)
def test_a_pattern_error_shows_the_pattern_verbatim_and_says_it_in_words(
    key: str, value: str, pattern: str, words: str, write_stack: Callable[..., Path]
) -> None:
    result = run_cli(["plan", "--stack", str(write_stack({**dev_config(), f"superkube:{key}": value}))])
    assert result.exit_code == 2
    (line,) = result.stderr.strip().splitlines()
    assert f"superkube:{key}: string should match pattern {pattern} (got {value!r}); " in line, line
    assert line.endswith(words), line


def test_every_pattern_of_the_spec_is_said_in_words() -> None:
    from superkube.model.spec import PATTERN_WORDS, ClusterSpec, NodePool

    patterns = {
        m.pattern
        for model in (ClusterSpec, NodePool)
        for f in model.model_fields.values()
        for m in f.metadata
        if getattr(m, "pattern", None)
    }
    assert patterns and patterns <= set(PATTERN_WORDS), patterns - set(PATTERN_WORDS)


@pytest.mark.parametrize(
    ("raw", "word"),
    [
        ("config: [1, 2]\n", "config: mapping"),
        ("config:\n  superkube:region: [eastus\n", "not valid YAML"),
        ("region: eastus\n", "unknown top-level key"),
    ],
)
def test_broken_stack_files(raw: str, word: str, write_stack: Callable[..., Path]) -> None:
    result = run_cli(["plan", "--stack", str(write_stack({}, raw=raw))])
    assert result.exit_code == 2
    assert word in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_a_share_written_as_a_yaml_number_plans_as_the_pulumi_cli_reads_it(
    write_stack: Callable[..., Path], tmp_path: Path
) -> None:
    """Pulumi.yaml declares the share a string (Pulumi's project schema has no `number`), and the
    Pulumi CLI takes any scalar for a string key as its text: so does the plan."""
    stack = write_stack({**dev_config(), "superkube:health_max_cordoned_share": 0.1})
    result = run_cli(["plan", "--stack", str(stack), "--out", str(tmp_path / "plan.json")])
    assert result.exit_code == 0, result.output
    plan = json.loads((tmp_path / "plan.json").read_text())
    assert plan["config"]["superkube:health_max_cordoned_share"] == "0.1"  # as Pulumi hands it over
    assert "--max-cordoned-share=0.1" in json.dumps(plan["resources"])  # the health controller's flag


def _dev_with_line_repeated(text: str) -> tuple[str, int]:
    """The dev stack file with the line that is `text` (stripped) written a second time below it."""
    lines = (ROOT / "stacks" / "Pulumi.dev.yaml").read_text().splitlines(keepends=True)
    at = next(i for i, line in enumerate(lines) if line.strip() == text)
    return "".join([*lines[: at + 1], lines[at], *lines[at + 1 :]]), at + 1


@pytest.mark.parametrize(
    ("line", "key", "named"),
    [
        ("config:", "config", "{stack}"),
        ("superkube:apiserver_count: 3", "superkube:apiserver_count", "{stack}"),
        ("nodes: 4", "nodes", "superkube:node_pools"),  # inside the YAML held in a string
        ("team: research", "team", "superkube:teams"),
    ],
)
def test_a_key_written_twice_is_refused_with_its_lines(
    line: str, key: str, named: str, write_stack: Callable[..., Path]
) -> None:
    raw, first = _dev_with_line_repeated(line)
    stack = write_stack({}, raw=raw)
    result = run_cli(["plan", "--stack", str(stack)])
    assert result.exit_code == 2, result.stdout
    where = f" of {stack}" if named != "{stack}" else ""
    assert result.stderr.strip() == (
        f"error: {named.format(stack=stack)}: key {key!r} is written twice (lines {first} and {first + 1}{where}); "
        "keep one of them (YAML keeps only the last value, and the Pulumi CLI refuses such a file)"
    )


def test_a_key_written_twice_in_a_config_value_is_refused_wherever_the_value_comes_from() -> None:
    """`pulumi up` hands the program strings with no file behind them: the spec refuses them too."""
    from superkube.model.spec import SpecError, from_config

    config = {k.partition(":")[2]: v for k, v in dev_config().items()}
    with pytest.raises(SpecError) as err:
        from_config({**config, "teams": "- {team: a, team: b, selector: {x: y}}"})
    assert str(err.value).startswith("superkube:teams: key 'team' is written twice (line 1 of the value)")


def test_unknown_stack_lists_the_known_ones() -> None:
    result = run_cli(["plan", "--stack", "nosuch"])
    assert result.exit_code == 2
    assert "dev" in result.stderr and "flagship" in result.stderr


def test_a_real_process_exits_2_without_traceback(write_stack: Callable[..., Path], tmp_path: Path) -> None:
    stack = write_stack({**dev_config(), "superkube:etcd_main_count": 2})
    svg = tmp_path / "t.svg"
    proc = subprocess.run(
        [sys.executable, "-m", "superkube.cli", "plan", "--stack", str(stack), "--diagram", str(svg)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert "superkube:etcd_main_count: must be odd (got 2)" in proc.stderr
    assert not svg.exists()


def test_diagram_must_be_svg(tmp_path: Path) -> None:
    result = run_cli(["plan", "--diagram", str(tmp_path / "t.png")])
    assert result.exit_code == 2 and "SVG" in result.stderr


@pytest.mark.parametrize(("raw", "says"), [("", "is empty"), ("config:\n", "has an empty config:")])
def test_an_empty_stack_file_says_it_is_empty(raw: str, says: str, write_stack: Callable[..., Path]) -> None:
    stack = write_stack({}, raw=raw)
    result = run_cli(["plan", "--stack", str(stack)])
    assert result.exit_code == 2
    assert result.stderr.strip() == (
        f"error: {stack}: {says}; add a config: mapping with at least superkube:ssh_public_key "
        "(stacks/Pulumi.dev.yaml shows the shape)"
    )


def test_a_pulumi_config_hint_names_the_stack(write_stack: Callable[..., Path]) -> None:
    stack = write_stack({"superkube:region": "eastus"}, name="team-a")
    result = run_cli(["plan", "--stack", str(stack)])
    assert result.exit_code == 2
    assert 'pulumi config set -s team-a superkube:ssh_public_key "ssh-ed25519 AAAA..."' in result.stderr


def _apply_suggestion(config: dict[str, Any], error: Any) -> bool:
    """Apply the concrete value an error's fix names (an address space, a pod-IP count); False if none."""
    import re

    cidr = re.search(r"e\.g\. (\d+\.\d+\.\d+\.\d+/\d+)", error.fix)
    if cidr:
        config[error.key] = cidr.group(1)
        return True
    lower = re.search(r"lower pod_ips_per_node of pool '(\w+)' to (\d+)", error.fix) or re.search(
        r"lower pod_ips_per_node to (\d+)", error.fix
    )
    if lower:
        pools_ = yaml.safe_load(config["superkube:node_pools"])
        index = int(re.search(r"node_pools\[(\d+)\]", error.key).group(1))  # type: ignore[union-attr]
        pools_[index]["pod_ips_per_node"] = int(lower.groups()[-1])
        config["superkube:node_pools"] = yaml.safe_dump(pools_)
        return True
    return False


SUGGESTING = [
    ("spoke too small", {"spoke_address_space": "10.64.0.0/17"}, "flagship"),
    ("spoke too small beside a peered spoke", {"spoke_address_space": "10.64.0.0/16"}, "flagship"),
    ("too many pod IPs for the VNet", {"node_pools": None}, "flagship"),
    ("300 pod IPs on a NIC", {"node_pools": pools(pod_ips_per_node=300)}, "dev"),
]


@pytest.mark.parametrize(("changes", "stack"), [c[1:] for c in SUGGESTING], ids=[c[0] for c in SUGGESTING])
def test_a_suggested_fix_itself_plans(changes: dict[str, Any], stack: str) -> None:
    from superkube.model.ipam import plan_addresses
    from superkube.model.spec import SpecError, from_config

    config = dict(yaml.safe_load((ROOT / "stacks" / f"Pulumi.{stack}.yaml").read_text())["config"])
    for key, value in changes.items():
        if key == "node_pools" and value is None:  # the flagship's GPU pool with 26 pod IPs per node
            value = config["superkube:node_pools"].replace("pod_ips_per_node: 7\n", "pod_ips_per_node: 26\n")
        config[f"superkube:{key}"] = value

    def plan(cfg: dict[str, Any]) -> SpecError | None:
        try:
            plan_addresses(from_config({k.partition(":")[2]: v for k, v in cfg.items()}), stack)
        except SpecError as exc:
            return exc
        return None

    error = plan(config)
    assert error is not None, "the case must start broken"
    assert _apply_suggestion(config, error), f"the fix names no value to apply: {error}"
    assert plan(config) is None, f"after applying {error.fix!r}: {plan(config)}"


def test_a_key_in_a_namespace_nothing_reads_is_refused_with_a_guess(write_stack: Callable[..., Path]) -> None:
    config = dev_config()
    config["superkub:region"] = config.pop("superkube:region")
    result = run_cli(["plan", "--stack", str(write_stack(config))])
    assert result.exit_code == 2
    assert result.stderr.strip() == (
        "error: superkub:region: namespace 'superkub' is neither superkube's nor a provider's (superkube, "
        "kubernetes, superkube-secrets, azure-native, pulumi), so nothing would read it; "
        "did you mean superkube:region?"
    )


@pytest.mark.parametrize(
    "key", ["azure-native:location", "pulumi:disable-default-providers", "kubernetes:context"]
)
def test_the_providers_namespaces_stay_allowed(key: str, write_stack: Callable[..., Path]) -> None:
    from superkube.plan import engine as planning

    stack = write_stack({**dev_config(), key: "eastus"})
    assert planning.read_stack_config(ROOT, str(stack))[key] == "eastus"


def test_a_yaml_error_inside_a_block_names_the_stack_files_line(write_stack: Callable[..., Path]) -> None:
    lines = (ROOT / "stacks" / "Pulumi.dev.yaml").read_text().splitlines(keepends=True)
    at = next(i for i, line in enumerate(lines) if line.strip() == "role: gpu")
    lines[at] = lines[at].replace("role: gpu", "role: gpu: x")
    stack = write_stack({}, raw="".join(lines))
    result = run_cli(["plan", "--stack", str(stack)])
    assert result.exit_code == 2
    column = lines[at].index("gpu:") + len("gpu:")  # the second ':' of the line, 1-based
    assert result.stderr.strip() == (
        f"error: superkube:node_pools: is not valid YAML at line {at + 1}, column {column} of {stack} "
        "(mapping values are not allowed here); fix the YAML syntax of the block"
    )


TWO_TEAMS_ONE_POOL = "- {selector: {superkube.io/pool: gpu}, team: research}\n- {selector: {superkube.io/pool: gpu}, team: pretraining}\n"


def _teams_stack(write_stack: Callable[..., Path], teams: str) -> str:
    return str(write_stack({**dev_config(), "superkube:teams": teams}))


@pytest.mark.parametrize(
    ("first_fix", "then"),
    [
        # make the selectors disjoint: a label value only one team's nodes carry
        (lambda t: t.replace("{superkube.io/pool: gpu}, team: research", "{superkube.io/pool: gpu, rack: a}, team: research")
         .replace("{superkube.io/pool: gpu}, team: pretraining", "{superkube.io/pool: gpu, rack: b}, team: pretraining"), None),
        # or mark the shared nodes any; against any, the team's tuple wins by a higher priority
        (lambda t: t.replace("team: pretraining", "team: any"), lambda t: t.replace("team: research}", "team: research, priority: 10}")),
    ],
    ids=["disjoint selectors", "shared nodes any"],
)  # fmt: skip
def test_the_advice_on_two_teams_sharing_nodes_passes_plan_and_check(
    first_fix: Callable[[str], str], then: Callable[[str], str] | None, write_stack: Callable[..., Path]
) -> None:
    """The spec and the rule platform-teams-no-overlap are one check (superkube.model.teams.problems):
    what plan advises is what check accepts, and a priority never makes two teams' overlap pass."""
    from superkube.model.teams import OVERLAP_FIX

    for teams in (
        TWO_TEAMS_ONE_POOL,
        TWO_TEAMS_ONE_POOL.replace("team: pretraining}", "team: pretraining, priority: 5}"),
    ):
        refused = run_cli(["plan", "--stack", _teams_stack(write_stack, teams)])
        assert refused.exit_code == 2 and refused.stderr.strip().endswith(f"; {OVERLAP_FIX}"), refused.stderr
    teams = first_fix(TWO_TEAMS_ONE_POOL)
    if then is not None:
        refused = run_cli(["plan", "--stack", _teams_stack(write_stack, teams)])
        assert (
            refused.exit_code == 2
            and "give the tuple whose nodes they should be a higher priority" in refused.stderr
        )
        teams = then(teams)
    stack = _teams_stack(write_stack, teams)
    planned = run_cli(["plan", "--stack", stack])
    assert planned.exit_code == 0, planned.stderr
    checked = run_cli(["check", "--stack", stack])
    assert checked.exit_code == 0, checked.stdout
