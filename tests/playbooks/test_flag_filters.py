"""The flag check kube_component's preflight runs, on the versioned lists it ships."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location(
    "superkube_flags", ROOT / "playbooks/filter_plugins/superkube_flags.py"
)
assert spec and spec.loader
flags_module: Any = importlib.util.module_from_spec(spec)
spec.loader.exec_module(flags_module)
ALL_KNOWN = yaml.safe_load((ROOT / "playbooks/roles/kube_component/vars/flags-1.35.yml").read_text())[
    "kube_component_known_flags"
]
KNOWN = ALL_KNOWN["kube-apiserver"]


def test_the_versioned_list_holds_the_flags_it_must() -> None:
    for name in (
        "etcd-servers",
        "etcd-servers-overrides",
        "audit-policy-file",
        "goaway-chance",
        "emulated-version",
    ):
        assert name in KNOWN
    # removed before 1.35: must not be accepted
    for gone in (
        "insecure-port",
        "apiserver-count",
        "azure-container-registry-config",
        "master-service-namespace",
    ):
        assert gone not in KNOWN


def test_good_flags_pass() -> None:
    flags = {
        "etcd-servers": "https://10.0.0.1:2379",
        "profiling": False,
        "max-requests-inflight": 3000,
        "request-timeout": "1m0s",
        "goaway-chance": 0.001,
    }
    assert flags_module.flag_problems(flags, KNOWN) == []


def test_each_kind_of_mistake_is_named() -> None:
    problems = flags_module.flag_problems(
        {
            "etcd-server": "x",
            "profiling": "maybe",
            "max-requests-inflight": "lots",
            "event-ttl": "an hour",
            "--secure-port": 6443,
            "audit-log-path": "",
        },
        KNOWN,
    )
    text = "\n".join(problems)
    assert "--etcd-server: not a flag of this version" in text and "etcd-servers" in text
    assert "--profiling=maybe: expects a bool" in text
    assert "--max-requests-inflight=lots: expects a int" in text
    assert "--event-ttl=an hour: expects a duration" in text
    assert "--secure-port: write flag names without the leading dashes" in text
    assert "--audit-log-path: has no value" in text
    assert len(problems) == 6


def test_args_render_sorted_with_lowercase_booleans() -> None:
    assert flags_module.flag_args({"profiling": False, "etcd-prefix": "/registry"}) == [
        "--etcd-prefix=/registry",
        "--profiling=false",
    ]


def test_the_autoscaler_flags_reach_the_host_as_kube_component_takes_them() -> None:
    """The plan's command line for cluster-autoscaler, as its role turns it into kube_component flags,
    passes the check against the release's own flag list; a flag the release lacks does not."""
    from superkube.cluster import autoscaling
    from superkube.plan import engine as planning

    _, spec, addresses = planning.load(ROOT, "flagship")
    flags = flags_module.args_to_flags(autoscaling.flags(spec, addresses.cluster))
    reference = flags_module.autoscaler_flag_reference(autoscaling.VERSION)
    assert set(reference) == autoscaling.reference_flags()
    assert flags["max-nodes-per-scaleup"] == str(spec.autoscaler_max_nodes_per_scaleup)
    assert flags_module.flag_problems(flags, reference) == []
    assert flags_module.flag_problems({**flags, "scale-up-rate": "5"}, reference) == [
        "--scale-up-rate: not a flag of this version"
    ]


def test_a_command_line_that_is_not_name_value_is_refused() -> None:
    import pytest

    with pytest.raises(ValueError, match="--name=value"):
        flags_module.args_to_flags(["--leader-elect"])
    with pytest.raises(ValueError, match=r"no flag list for cluster-autoscaler 9\.9\.9"):
        flags_module.autoscaler_flag_reference("9.9.9")
