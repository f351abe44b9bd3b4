"""The per-pod accounting CNI step on real iptables, with the node's real CNI chain.

Each test makes a node of its own (superkube.harness.podnet): a network namespace holding the node's
NIC and one beyond it for the VNet, a hub host and an internet host; pods wired by the conflist
`superkube-cni-config` writes, each plugin run as a container runtime runs it (Debian's ptp,
host-local and portmap, our superkube-bandwidth and superkube-pod-accounting). The cluster name,
internal ranges and lock come from the settings the iptables_accounting role renders for the
flagship; the node-level rules, hooks and apply script are that role's and iptables_base's, rendered
the same way. UDP datagrams of known sizes go between the namespaces (their receivers drop them, so
nothing answers), and the counters are read through the exporter's own parse() of `iptables-save -c`:
each pod's bytes and packets per direction and kind are exactly what was sent, 28 bytes of IP and UDP
header on each datagram.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from superkube.agents import cni_accounting, cni_config, iptables_exporter
from superkube.harness.podnet import HUB, INTERNET, NODE_IP, Pod, RoleFiles
from superkube.harness.podnet import PodNode as Node
from superkube.plan import checks
from superkube.plan.engine import Plan
from tests.conftest import ROOT

HEADERS = 28  # IPv4 + UDP
TRAFFIC = ("internal-in", "internal-out", "internet-in", "internet-out")


def role_files(plan: Plan) -> RoleFiles:
    """What the iptables_accounting and iptables_base roles write on one of the plan's GPU nodes."""
    engine = checks.plan_wiring(plan)
    host = next(h for h in engine.hosts if h.group == "gpu_nodes")
    base = yaml.safe_load((ROOT / "playbooks/roles/iptables_base/defaults/main.yml").read_text())
    settings = engine.render("iptables_accounting", host, ["iptables_accounting_pod_settings"], **base)
    return RoleFiles(
        settings=settings["iptables_accounting_pod_settings"],
        rules=engine.template("iptables_accounting", host, "accounting.rules.j2"),
        hooks=engine.template("iptables_accounting", host, "accounting.hooks.j2"),
        apply_script=engine.template(
            "iptables_base", host, "superkube-iptables-apply.sh.j2", iptables_base_dir="{dir}"
        ),
    )


@pytest.fixture(scope="module")
def role(flagship_plan: Plan) -> RoleFiles:
    return role_files(flagship_plan)


@pytest.fixture
def node(tmp_path: Path, role: RoleFiles) -> Iterator[Node]:
    made = Node(tmp_path, role)
    try:
        yield made.up()
    finally:
        made.down()


def expected(pod: Pod, **bytes_by_traffic: list[int]) -> dict[tuple[str, str, str], tuple[int, int]]:
    """A pod's four series from the payload sizes of the datagrams of each traffic kind."""
    out = {}
    for traffic in TRAFFIC:
        sizes = bytes_by_traffic.get(traffic.replace("-", "_"), [])
        out[(pod.namespace, pod.name, traffic)] = (len(sizes), sum(s + HEADERS for s in sizes))
    return out


def test_each_pods_bytes_count_by_direction_internal_and_internet(node: Node) -> None:
    a, _ = node.add("team-a", "trainer-0")
    b, _ = node.add("team-b", "loader-0")
    node.send(a.netns, INTERNET, 3, 1000)  # routed out of the node: FORWARD
    node.send(node.world, a.ip, 2, 500, src=INTERNET)  # routed in
    node.send(a.netns, b.ip, 4, 200)  # pod to pod on one node: one's out, the other's in
    node.send(b.netns, HUB, 5, 100)  # the hub is internal
    node.send(b.netns, NODE_IP, 1, 300)  # to the node itself: INPUT, which FORWARD never sees
    node.send(node.name, b.ip, 2, 400)  # from the node itself: OUTPUT
    assert node.per_pod() == {
        **expected(a, internet_out=[1000] * 3, internet_in=[500] * 2, internal_out=[200] * 4),
        **expected(b, internal_in=[200] * 4 + [400] * 2, internal_out=[100] * 5 + [300]),
    }
    # the series as the exporter labels them: the pod's own chain, the cluster, the table
    (labels,) = [k for k in node.series() if "pod=trainer-0" in k and "traffic=internet-out" in k]
    out_chain, _ = cni_accounting.chains(a.container_id)
    assert labels == (
        f"chain={out_chain}",
        "cluster=flagship",
        "namespace=team-a",
        "pod=trainer-0",
        "table=mangle",
        "traffic=internet-out",
    )
    assert len(out_chain) <= cni_accounting.CHAIN_MAX


def test_del_removes_the_pods_rules_and_series_and_a_second_del_succeeds(node: Node) -> None:
    # a DEL for a container this node never saw, before any pod made the shared chains
    assert node.accounting("DEL", "never-seen").returncode == 0
    a, _ = node.add("team-a", "a-0")
    b, _ = node.add("team-a", "b-0")
    node.send(a.netns, INTERNET, 1, 10)
    node.send(b.netns, INTERNET, 1, 20)
    node.delete(a)
    assert {key[1] for key in node.per_pod()} == {"b-0"}
    assert node.per_pod()[("team-a", "b-0", "internet-out")] == (1, 20 + HEADERS)
    saved = node.saved()
    assert not any(chain in saved for chain in cni_accounting.chains(a.container_id))
    assert f"{a.ip}/32" not in saved
    node.delete(a)  # the runtime may DEL again: still success
    assert node.accounting("DEL", "never-seen").returncode == 0
    node.delete(b)
    assert node.per_pod() == {} and node.chains() == []
    rules = [line for line in node.saved().splitlines() if "SUPERKUBE-PODS" in line and line.startswith("[")]
    assert [r.split("] ", 1)[1] for r in rules] == [
        "-A PREROUTING -j SUPERKUBE-PODS-OUT",
        "-A POSTROUTING -j SUPERKUBE-PODS-IN",
    ], "the shared chains stay, empty, with one jump each"


def test_the_nodes_rule_restore_keeps_the_per_pod_counters(node: Node) -> None:
    node.apply_role()  # at boot, before any pod: the shared chains exist, empty
    a, _ = node.add("team-a", "a-0")
    node.send(a.netns, INTERNET, 3, 700)
    node.send(node.world, a.ip, 1, 50, src=INTERNET)
    before = node.per_pod()
    assert before == expected(a, internet_out=[700] * 3, internet_in=[50])
    assert node.node_level()["internet-out"] == 3 * (700 + HEADERS)
    node.apply_role()  # a converge's restart of superkube-iptables@accounting
    assert node.per_pod() == before
    assert node.node_level()["internet-out"] == 0, "the role's own chains are restored, from zero"
    node.send(a.netns, INTERNET, 1, 100)
    assert node.per_pod()[("team-a", "a-0", "internet-out")] == (4, 3 * (700 + HEADERS) + 100 + HEADERS)
    hooks = [line for line in node.saved().splitlines() if re.search(r"-A \w+ -j SUPERKUBE-", line)]
    assert sorted(h.split("] ", 1)[1] for h in hooks) == sorted(
        [
            "-A PREROUTING -j SUPERKUBE-PODS-OUT",
            "-A POSTROUTING -j SUPERKUBE-PODS-IN",
            "-A INPUT -j SUPERKUBE-ACCT-IN",
            "-A FORWARD -j SUPERKUBE-ACCT-IN",
            "-A FORWARD -j SUPERKUBE-ACCT-OUT",
            "-A OUTPUT -j SUPERKUBE-ACCT-OUT",
        ]
    ), "each jump once, however often the rules are restored"
    # the counters live in the kernel, not the exporter: a restarted exporter (a new one, its label
    # cache empty as a new process's) reads the same series the running one does
    wrapper = node.tmp / "iptables-save-in-node"
    wrapper.write_text(f'#!/bin/sh\nexec ip netns exec {node.name} iptables-save "$@"\n')
    wrapper.chmod(0o755)

    def pod_series(body: bytes) -> list[str]:
        return sorted(line for line in body.decode().splitlines() if 'pod="a-0"' in line)

    running = pod_series(iptables_exporter.Exporter(["mangle"], str(wrapper)).scrape())
    iptables_exporter._LABELS.clear()
    restarted = pod_series(iptables_exporter.Exporter(["mangle"], str(wrapper)).scrape())
    assert restarted == running and len(running) == 2 * len(TRAFFIC), running
    total = 3 * (700 + HEADERS) + 100 + HEADERS
    assert any('traffic="internet-out"' in line and line.endswith(f" {total}") for line in restarted), (
        restarted
    )


def test_a_pod_without_names_keeps_node_level_accounting_and_logs_one_line(node: Node) -> None:
    node.apply_role()
    pod, logged = node.add("", "", args="IgnoreUnknown=1;K8S_POD_INFRA_CONTAINER_ID=x")
    assert pod.result["ips"], "the ADD passed the previous result on"
    assert logged.count("\n") == 1 and "node level only" in logged and "K8S_POD_NAME=''" in logged
    assert node.chains() == []
    node.send(pod.netns, INTERNET, 2, 600)
    assert node.node_level()["internet-out"] == 2 * (600 + HEADERS)
    assert node.per_pod() == {}
    node.delete(pod)


def at_once(work: Any, items: list[Any]) -> list[Any]:
    """`work(item)` for every item in threads of their own, started together; the results in order."""
    results: list[Any] = [None] * len(items)
    errors: list[BaseException] = []
    start = threading.Barrier(len(items))

    def one(i: int) -> None:
        try:
            start.wait()
            results[i] = work(items[i])
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(items))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    return results


def assert_exactly(node: Node, pods: dict[str, str]) -> None:
    """The node's mangle table holds one jump per hook and each pod's chains, by container: IP."""
    saved = node.saved()
    assert saved.count("-A PREROUTING -j SUPERKUBE-PODS-OUT") == 1
    assert saved.count("-A POSTROUTING -j SUPERKUBE-PODS-IN") == 1
    assert node.chains() == sorted(c for container in pods for c in cni_accounting.chains(container))
    dispatch = sorted(line.split("] ", 1)[1] for line in saved.splitlines() if "-j SKPOD-" in line)
    want = []
    for container, ip in pods.items():
        out_chain, in_chain = cni_accounting.chains(container)
        want += [
            f"-A SUPERKUBE-PODS-OUT -s {ip}/32 -j {out_chain}",
            f"-A SUPERKUBE-PODS-IN -d {ip}/32 -j {in_chain}",
        ]
    assert dispatch == sorted(want)
    assert len(node.per_pod()) == 4 * len(pods)


def test_adds_and_dels_at_once_make_and_remove_exactly_each_pods_rules(node: Node) -> None:
    """The runtime runs several pods' ADDs and DELs at once: the lock keeps each transaction whole."""
    # the accounting step alone, 16 at once from a node without the shared chains, where every
    # transaction would read the same table and each would make the chains and jumps again
    steps = {f"step-{i}": f"10.64.2.{i}" for i in range(16)}

    def step(command: str, container: str) -> None:
        prev = {"cniVersion": "1.0.0", "ips": [{"address": f"{steps[container]}/20"}]}
        proc = node.accounting(
            command, container, prev, args=f"K8S_POD_NAMESPACE=batch;K8S_POD_NAME={container}"
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr

    at_once(lambda c: step("ADD", c), list(steps))
    assert_exactly(node, steps)
    at_once(lambda c: step("DEL", c), list(steps))
    assert_exactly(node, {})
    # and whole pods through the chain, ten at once
    pods = at_once(lambda i: node.add("batch", f"worker-{i}")[0], list(range(10)))
    assert_exactly(node, {pod.container_id: pod.ip for pod in pods})
    at_once(node.delete, pods)
    assert_exactly(node, {})


def test_long_names_are_shortened_by_a_hash_never_cut(node: Node) -> None:
    namespace = "n" * 63
    name = "p" * 200 + "-" + "q" * 52  # 253 characters, Kubernetes' longest pod name
    first, _ = node.add(namespace, name)
    again, _ = node.add(namespace, name)  # another sandbox of the same pod: the same labels
    comments = re.findall(r'--comment "([^"]*)"', node.saved())
    assert comments and max(len(c) for c in comments) <= cni_accounting.COMMENT_MAX
    labels = {(ns, pod) for ns, pod, _ in node.per_pod()}
    (shown,) = labels
    assert shown[0] == namespace, "the namespace fits whole beside a shortened pod name"
    assert shown[1].startswith("p" * 100) and shown[1].endswith(
        "-" + hashlib.sha256(name.encode()).hexdigest()[:8]
    )
    assert len(node.per_pod()) == 4  # both sandboxes carry the same namespace and pod labels
    # a different long name keeps its own labels
    other = "p" * 200 + "-" + "r" * 52
    node.add(namespace, other)
    assert len({pod for _, pod, _ in node.per_pod()}) == 2
    node.delete(first)
    node.delete(again)


def test_an_add_clears_what_a_pod_of_the_same_ip_left_behind(node: Node) -> None:
    prev = {"cniVersion": "1.0.0", "ips": [{"address": "10.64.1.99/20", "gateway": NODE_IP}]}
    for container in ("leaked", "next"):  # the first is never DELeted
        proc = node.accounting("ADD", container, prev)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert json.loads(proc.stdout) == prev
    assert node.chains() == sorted(cni_accounting.chains("next"))
    assert node.saved().count("10.64.1.99/32") == 2


def test_bad_configuration_is_a_cni_error_and_a_node_without_settings_only_logs(node: Node) -> None:
    prev = {"cniVersion": "1.0.0", "ips": [{"address": "10.64.1.98/20"}]}
    proc = node.accounting("ADD", "c1", prev, settings=None)
    assert proc.returncode == 1 and json.loads(proc.stdout)["code"] == 7
    assert "names no settings file" in json.loads(proc.stdout)["msg"]
    proc = node.accounting("ADD", "c1", prev, settings=str(node.tmp / "missing.json"))
    assert proc.returncode == 0 and json.loads(proc.stdout) == prev
    assert proc.stderr.count("\n") == 1 and "missing.json" in proc.stderr
    version = node.accounting("VERSION", "c1")
    assert version.returncode == 0 and "1.0.0" in json.loads(version.stdout)["supportedVersions"]


def test_the_conflist_names_the_file_the_role_writes(flagship_plan: Plan) -> None:
    engine = checks.plan_wiring(flagship_plan)
    host = next(h for h in engine.hosts if h.group == "gpu_nodes")
    base = yaml.safe_load((ROOT / "playbooks/roles/iptables_base/defaults/main.yml").read_text())
    written = engine.render("iptables_accounting", host, ["iptables_accounting_pod_settings_file"], **base)
    named = engine.render("node_software", host, ["node_software_cni_pod_accounting_settings"])
    assert (
        written["iptables_accounting_pod_settings_file"]
        == named["node_software_cni_pod_accounting_settings"]
        == cni_config.DEFAULT_ACCOUNTING_SETTINGS
    )
    settings = engine.render("iptables_accounting", host, ["iptables_accounting_pod_settings"], **base)
    assert settings["iptables_accounting_pod_settings"]["lockFile"] == cni_accounting.DEFAULT_LOCK
    hooks = engine.template("iptables_accounting", host, "accounting.hooks.j2")
    for hook, chain in cni_accounting.HOOKS:
        assert f"mangle {hook} {chain}" in hooks
    unit = engine.template("node_software", host, "superkube-cni-config.service.j2")
    assert f"--pod-accounting-settings {cni_config.DEFAULT_ACCOUNTING_SETTINGS}" in unit


@pytest.mark.parametrize(
    ("args", "want"),
    [
        (
            "IgnoreUnknown=1;K8S_POD_NAMESPACE=a;K8S_POD_NAME=b",
            {"IgnoreUnknown": "1", "K8S_POD_NAMESPACE": "a", "K8S_POD_NAME": "b"},
        ),
        ("", {}),
        ("junk;K8S_POD_NAME=x=y", {"K8S_POD_NAME": "x=y"}),
    ],
)
def test_cni_args_are_read_as_runtimes_write_them(args: str, want: dict[str, str]) -> None:
    assert cni_accounting.cni_args(args) == want


def test_labels_fit_every_comment_and_the_same_names_give_the_same_labels() -> None:
    assert cni_accounting.pod_labels("flagship", "ns", "pod") == ("ns", "pod")
    for namespace, pod in (("n" * 63, "p" * 253), ("n" * 63, "p" * 150), ("a", "b" * 253)):
        ns, name = cni_accounting.pod_labels("flagship", namespace, pod)
        assert len(cni_accounting.comment("flagship", "internal-out", ns, name)) <= cni_accounting.COMMENT_MAX
        assert (ns, name) == cni_accounting.pod_labels("flagship", namespace, pod)
        assert ns == namespace and name.endswith(hashlib.sha256(pod.encode()).hexdigest()[:8])
