"""The spec's defaults, Pulumi.yaml kept in step with it, and the stack loader."""

from __future__ import annotations

from pathlib import Path

import yaml

from superkube.model.spec import CONFIG_KEYS, ClusterSpec
from superkube.plan import schema
from superkube.plan.engine import read_stack_config


def test_pulumi_yaml_is_generated_from_the_spec(root: Path) -> None:
    assert (root / "Pulumi.yaml").read_text() == schema.pulumi_yaml(), "run: superkube config-schema --write"


def test_every_key_is_declared_with_a_type_description_and_default(root: Path) -> None:
    project = yaml.safe_load((root / "Pulumi.yaml").read_text())
    assert project["name"] == "superkube" and project["stackConfigDir"] == "stacks"
    declared = project["config"]
    assert list(declared) == list(CONFIG_KEYS)
    for key, decl in declared.items():
        assert decl["type"] in ("string", "integer", "boolean", "array"), (
            key
        )  # what Pulumi's project schema allows
        assert decl["description"] and "default" in decl, key
        if decl["type"] == "array":
            assert decl["items"] == {"type": "string"}


def test_shipped_stacks_use_only_declared_keys(root: Path) -> None:
    declared = set(yaml.safe_load((root / "Pulumi.yaml").read_text())["config"])
    for path in (root / "stacks").glob("Pulumi.*.yaml"):
        keys = yaml.safe_load(path.read_text())["config"]
        for key in keys:
            namespace, _, name = key.partition(":")
            assert namespace == "superkube" and name in declared, f"{path.name}: {key}"


def test_defaults_from_pulumi_yaml_fill_what_a_stack_leaves_out(root: Path, tmp_path: Path) -> None:
    stack = tmp_path / "Pulumi.min.yaml"
    stack.write_text("config:\n  superkube:ssh_public_key: ssh-ed25519 " + "A" * 68 + "\n")
    config = read_stack_config(root, str(stack))
    assert config["superkube:etcd_main_count"] == "5"  # integers reach the program as strings
    assert config["superkube:autoscaler_enabled"] == "true"
    assert config["superkube:control_plane_zones"] == '["1", "2", "3"]'
    parsed = ClusterSpec.model_validate({k.partition(":")[2]: v for k, v in config.items()})
    assert parsed.etcd_main_count == 5 and parsed.node_pools[0].role == "gpu"


def test_a_pools_team_is_what_its_own_labels_decide() -> None:
    """The team a pool's nodes register with: by the highest-priority tuple the pool's labels (name,
    role, node_pools[].labels) decide. A tuple on a label the pool does not carry cannot be told
    before a node exists, so it is left to the reconciler; one the labels rule out never counts."""
    from superkube.model.spec import NodePool
    from superkube.model.teams import parse

    def pool(name: str, **labels: str) -> NodePool:
        return NodePool(
            name=name, role="gpu", vm_size="Standard_ND96isr_H100_v5", nodes=10, gpus_per_node=8,
            pod_ips_per_node=7, labels=labels,
        )  # fmt: skip

    tuples = parse(
        [
            {"selector": {"superkube.io/role": "gpu"}, "team": "any", "priority": 0},
            {"selector": {"superkube.io/pool": "gpu", "rack": "a"}, "team": "research", "priority": 10},
            {"selector": {"superkube.io/pool": "big", "tier": "pre"}, "team": "pretraining", "priority": 10},
            # (two teams' tuples may not share nodes: this one keeps to research's pool)
            {
                "selector": {"superkube.io/cluster": "other", "superkube.io/pool": "gpu"},
                "team": "research",
                "priority": 20,
            },
        ]
    )
    spec = ClusterSpec.model_construct(teams=tuples)
    assert tuples[1].undecided_by(pool("gpu").template_labels("c")) == ["rack"]
    assert spec.pool_team(pool("gpu"), "c") == "any"  # the rack tuple waits for a rack label
    assert spec.pool_team(pool("big", tier="pre"), "c") == "pretraining"
    assert tuples[2].undecided_by(pool("big", tier="post").template_labels("c")) == []  # ruled out
    assert spec.pool_team(pool("big", tier="post"), "c") == "any"
    assert tuples[3].undecided_by(pool("gpu").template_labels("c")) == []  # another cluster's
    assert ClusterSpec.model_construct(teams=[]).pool_team(pool("gpu"), "c") is None
