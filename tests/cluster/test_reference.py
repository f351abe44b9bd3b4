"""Component configs against their release's reference: real fields pass, anything else is named."""

from __future__ import annotations

import pytest

from superkube.cluster import reference

KUBELET = {"apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration"}
PROXY = {"apiVersion": "kubeproxy.config.k8s.io/v1alpha1", "kind": "KubeProxyConfiguration"}
SCHEDULER = {"apiVersion": "kubescheduler.config.k8s.io/v1", "kind": "KubeSchedulerConfiguration"}


def test_fields_of_the_release_pass() -> None:
    assert (
        reference.problems(
            {**KUBELET, "maxPods": 15, "syncFrequency": "1m30s", "failCgroupV1": True}, "1.35.0"
        )
        == []
    )
    assert reference.problems({**PROXY, "mode": "iptables", "configSyncPeriod": "15m0s"}, "1.35.0") == []
    plugins = {"queueSort": {"enabled": [{"name": "Coscheduling"}], "disabled": [{"name": "*"}]}}
    profile = {
        "schedulerName": "default-scheduler",
        "plugins": plugins,
        "pluginConfig": [{"name": "Coscheduling", "args": {}}],
    }
    assert (
        reference.problems(
            {**SCHEDULER, "leaderElection": {"leaderElect": True}, "profiles": [profile]}, "1.35.0"
        )
        == []
    )


@pytest.mark.parametrize(
    ("document", "expected"),
    [
        ({**KUBELET, "maxPod": 15}, "maxPod is not a field of Kubernetes 1.35"),
        # added to the kubelet after 1.35: not accepted for 1.35
        ({**KUBELET, "memoryReservationPolicy": "None"}, "memoryReservationPolicy is not a field"),
        ({**KUBELET, "maxPods": "15"}, "maxPods: '15' is not of type 'integer'"),
        ({**KUBELET, "syncFrequency": "1 minute"}, "syncFrequency: '1 minute' does not match"),
        ({**KUBELET, "registerWithTaints": [{"key": "a", "effect": "Never"}]}, "registerWithTaints.0.effect"),
        ({**KUBELET, "authentication": {"x509": {"clientCAfile": "x"}}}, "authentication.x509: clientCAfile"),
        ({**PROXY, "clientConnection": {"kubeConfig": "x"}}, "clientConnection: kubeConfig is not a field"),
        ({**SCHEDULER, "profiles": [{"plugins": {"queuesort": {}}}]}, "profiles.0.plugins: queuesort"),
        (
            {**KUBELET, "apiVersion": "kubelet.config.k8s.io/v1"},
            "apiVersion: 'kubelet.config.k8s.io/v1beta1' was expected",
        ),
    ],
)
def test_anything_else_is_named_with_its_field(document: dict[str, object], expected: str) -> None:
    found = reference.problems(document, "1.35.0")
    assert any(expected in line for line in found), found


def test_a_version_without_a_reference_says_how_to_make_one() -> None:
    with pytest.raises(reference.NoReference, match=r"scripts/k8s_config_reference\.py"):
        reference.problems(dict(KUBELET), "1.36.0")
