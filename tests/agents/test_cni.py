"""The node's CNI pieces off the lab: the metadata -> conflist writer, the egress burst, the lab's IMDS.

The lab tests (tests/lab/test_pod_network.py) run the same programs on booted hosts with real
plugins; these cover every fault of the input and the arithmetic.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from superkube.agents import cni_accounting, cni_bandwidth, cni_config
from superkube.cluster import cloudinit
from superkube.lab import imds
from superkube.lab.cnirun import CRI_BURST, capabilities, cni_args
from superkube.model import rates

DOC = imds.document(
    name="gpu-vmss_0",
    scale_set="gpu-vmss",
    location="westus3",
    vm_size="Standard_ND96isr_H100_v5",
    tags={"superkube-pool": "gpu", cni_config.EGRESS_TAG: "100000000"},
    primary="10.64.0.4",
    secondary=["10.64.0.10", "10.64.0.11", "10.64.0.12", "10.64.0.20"],
    prefixlen=20,
    mac="00:0d:3a:5b:00:01",
)


def test_the_network_document_gives_the_node_ip_its_subnet_and_the_pod_ips() -> None:
    node = cni_config.parse_network(DOC["network"])
    assert node == cni_config.NodeAddresses(
        "10.64.0.4", "10.64.0.0/20", ("10.64.0.10", "10.64.0.11", "10.64.0.12", "10.64.0.20")
    )


def test_the_conflist_hands_out_exactly_the_pod_ips_with_the_node_as_gateway() -> None:
    node = cni_config.parse_network(DOC["network"])
    conf = cni_config.conflist(node, egress_bits=cni_config.egress_default(DOC["compute"]["tagsList"]))
    assert [p["type"] for p in conf["plugins"]] == [
        "ptp",
        "superkube-bandwidth",
        "superkube-pod-accounting",
        "portmap",
    ]
    ptp = conf["plugins"][0]
    assert ptp["ipMasq"] is False
    (range_set,) = ptp["ipam"]["ranges"]
    # contiguous IPs are one range; the gap makes a second; nothing else is in any range
    assert [(r["rangeStart"], r["rangeEnd"]) for r in range_set] == [
        ("10.64.0.10", "10.64.0.12"),
        ("10.64.0.20", "10.64.0.20"),
    ]
    assert {r["gateway"] for r in range_set} == {"10.64.0.4"}
    assert ptp["ipam"]["dataDir"].startswith("/run/")  # a reboot releases every allocation
    assert conf["plugins"][1] == {
        "type": "superkube-bandwidth",
        "capabilities": {"bandwidth": True},
        "defaultEgressRate": 100_000_000,
    }
    # the per-pod accounting reads the settings file the iptables_accounting role writes
    assert conf["plugins"][2] == {
        "type": "superkube-pod-accounting",
        "settings": "/etc/superkube/iptables/pod-accounting.json",
    }
    assert conf["plugins"][3]["capabilities"] == {"portMappings": True}


def _broken(path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    doc = copy.deepcopy(DOC["network"])
    target = doc
    for key in path[:-1]:
        target = target[key]
    if value is KeyError:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return doc


@pytest.mark.parametrize(
    ("path", "value", "named"),
    [
        (("interface",), [], "network.interface[0]: missing"),
        (("interface", 0, "ipv4", "ipAddress"), [], "ipAddress: empty"),
        (
            ("interface", 0, "ipv4", "ipAddress", 2, "privateIpAddress"),
            "10.64.0",
            "ipAddress[2].privateIpAddress",
        ),
        (("interface", 0, "ipv4", "ipAddress", 1, "privateIpAddress"), "10.99.0.9", "outside the subnet"),
        (("interface", 0, "ipv4", "ipAddress", 1, "privateIpAddress"), "10.64.0.4", "listed twice"),
        (("interface", 0, "ipv4", "subnet"), KeyError, "network.interface[0].ipv4.subnet: missing"),
        (("interface", 0, "ipv4", "subnet", 0, "prefix"), "forty", "not an IPv4 subnet"),
        (("interface", 0, "ipv4", "ipAddress"), [{"privateIpAddress": "10.64.0.4"}], "no pod IPs"),
    ],
)
def test_malformed_metadata_is_one_error_naming_the_field(
    path: tuple[Any, ...], value: Any, named: str
) -> None:
    with pytest.raises(cni_config.MetadataError) as err:
        cni_config.parse_network(_broken(path, value))
    assert named in str(err.value)
    assert "\n" not in str(err.value)


def test_a_bad_egress_tag_is_named() -> None:
    with pytest.raises(
        cni_config.MetadataError, match="superkube-egress-limit: '10M' is not bits per second"
    ):
        cni_config.egress_default([{"name": cni_config.EGRESS_TAG, "value": "10M"}])
    assert cni_config.egress_default([{"name": "other", "value": "x"}]) is None


@pytest.fixture(scope="module")
def metadata() -> Iterator[dict[str, Any]]:
    """The lab's metadata server on loopback (as 127.0.0.1 it answers with the served document)."""
    served: dict[str, Any] = {"doc": DOC}

    server = ThreadingHTTPServer(("127.0.0.1", 0), imds.handler(lambda _source: served["doc"]))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    served["url"] = f"http://127.0.0.1:{server.server_address[1]}{imds.ROOT}"
    yield served
    server.shutdown()
    server.server_close()


def _write(metadata: dict[str, Any], out: Path) -> subprocess.CompletedProcess[str]:
    script = Path(cni_config.__file__)
    return subprocess.run(
        [sys.executable, str(script), "--out", str(out), "--metadata", metadata["url"], "--tries", "1"],
        capture_output=True,
        text=True,
        timeout=30,
    )


def test_the_writer_run_as_the_boot_unit_runs_it(metadata: dict[str, Any], tmp_path: Path) -> None:
    out = tmp_path / "net.d" / "10-superkube.conflist"
    proc = _write(metadata, out)
    assert proc.returncode == 0, proc.stderr
    assert "4 pod IPs in 10.64.0.0/20" in proc.stdout
    written = json.loads(out.read_text())
    assert written["plugins"][1]["defaultEgressRate"] == 100_000_000
    assert written["plugins"][2]["settings"] == cni_config.DEFAULT_ACCOUNTING_SETTINGS
    elsewhere = tmp_path / "elsewhere.conflist"
    script = Path(cni_config.__file__)
    proc = subprocess.run(
        [sys.executable, str(script), "--out", str(elsewhere), "--metadata", metadata["url"], "--tries", "1",
         "--pod-accounting-settings", "/etc/other/pod-accounting.json"],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert json.loads(elsewhere.read_text())["plugins"][2]["settings"] == "/etc/other/pod-accounting.json"
    assert oct(out.stat().st_mode & 0o777) == "0o644"


def test_bad_metadata_writes_nothing_and_keeps_what_was_there(
    metadata: dict[str, Any], tmp_path: Path
) -> None:
    out = tmp_path / "10-superkube.conflist"
    metadata["doc"] = {
        **DOC,
        "network": _broken(("interface", 0, "ipv4", "ipAddress", 1, "privateIpAddress"), "x"),
    }
    try:
        proc = _write(metadata, out)
        assert proc.returncode == 1
        assert proc.stderr.count("\n") == 1 and "ipAddress[1].privateIpAddress: 'x'" in proc.stderr
        assert "none written" in proc.stderr and list(tmp_path.iterdir()) == []
        out.write_text("previous\n")
        proc = _write(metadata, out)
        assert proc.returncode == 1 and "kept the previous one" in proc.stderr
        assert out.read_text() == "previous\n" and list(tmp_path.iterdir()) == [out]
    finally:
        metadata["doc"] = DOC


def test_no_metadata_service_is_one_line_not_a_traceback(tmp_path: Path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            cni_config.__file__,
            "--out",
            str(tmp_path / "c"),
            "--metadata",
            "http://127.0.0.1:9",
            "--tries",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert "instance metadata" in proc.stderr


def test_the_metadata_service_refuses_what_azure_refuses() -> None:
    ok = {"Metadata": "true"}
    assert imds.answer(DOC, "/metadata/instance/network?api-version=2021-02-01", ok) == (200, DOC["network"])
    status, body = imds.answer(DOC, "/metadata/instance/compute/tagsList?api-version=2021-02-01", ok)
    assert status == 200 and {"name": "superkube-pool", "value": "gpu"} in body
    assert imds.answer(DOC, "/metadata/instance/network?api-version=2021-02-01", {})[0] == 400
    assert "api-version" in imds.answer(DOC, "/metadata/instance/network", ok)[1]["error"]
    assert (
        imds.answer(DOC, "/metadata/instance?api-version=1", {**ok, "X-Forwarded-For": "1.2.3.4"})[0] == 400
    )
    assert imds.answer(None, "/metadata/instance?api-version=1", ok)[0] == 404
    assert imds.answer(DOC, "/metadata/instance/nothing?api-version=1", ok)[0] == 404


def test_every_ip_of_a_nic_is_known_as_that_host() -> None:
    sources = imds.by_source({"gpu-1": DOC})
    assert set(sources) == {"10.64.0.4", "10.64.0.10", "10.64.0.11", "10.64.0.12", "10.64.0.20"}


# --- the egress burst ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "bits"),
    [("10M", 10**7), ("100M", 10**8), ("1G", 10**9), ("1.5G", 15 * 10**8), ("500Ki", 512_000), ("1k", 1000)],
)
def test_rates_read_as_the_kubelet_reads_the_annotation(text: str, bits: int) -> None:
    assert rates.parse_rate(text) == bits


@pytest.mark.parametrize("text", ["10Mbps", "100m", "1", "2P", "", "M", "1e9"])
def test_rates_the_kubelet_would_refuse_are_refused(text: str) -> None:
    with pytest.raises(rates.RateError):
        rates.parse_rate(text)


def test_the_cri_burst_is_bounded_and_the_rate_kept() -> None:
    caps = capabilities("10M")
    assert caps["bandwidth"] == {
        "IngressRate": 0,
        "IngressBurst": 0,
        "EgressRate": 10**7,
        "EgressBurst": CRI_BURST,
    }
    out = cni_bandwidth.shaped(
        {"type": "superkube-bandwidth", "runtimeConfig": caps, "capabilities": {"bandwidth": True}}
    )
    assert out["type"] == "bandwidth"
    assert out["runtimeConfig"]["bandwidth"] == {"egressRate": 10**7, "egressBurst": 64 * 1024 * 8}
    # at 1 Gbit/s the bucket holds 10 ms of the rate
    fast = cni_bandwidth.shaped({"runtimeConfig": capabilities("1G")})
    assert fast["runtimeConfig"]["bandwidth"]["egressBurst"] == 10**7
    # a burst already smaller than ours is left alone
    small = cni_bandwidth.shaped({"runtimeConfig": {"bandwidth": {"egressRate": 10**9, "egressBurst": 8000}}})
    assert small["runtimeConfig"]["bandwidth"]["egressBurst"] == 8000
    # CNI's own spelling is read too, and wins where a runtime sent both
    spelled = cni_bandwidth.shaped(
        {"runtimeConfig": {"bandwidth": {"egressRate": 10**7, "EgressRate": 1, "egressBurst": CRI_BURST}}}
    )
    assert spelled["runtimeConfig"]["bandwidth"] == {"egressRate": 10**7, "egressBurst": 64 * 1024 * 8}


def test_the_lab_runner_names_a_pod_where_the_accounting_reads_the_runtimes_names() -> None:
    named = cni_accounting.cni_args(cni_args("use-a0", "team-a", "trainer-0"))
    assert named == {
        "IgnoreUnknown": "1",
        "K8S_POD_NAMESPACE": "team-a",
        "K8S_POD_NAME": "trainer-0",
        "K8S_POD_INFRA_CONTAINER_ID": "use-a0",
    }
    plain = cni_accounting.cni_args(cni_args("acct-a"))  # no name given: the sandbox's, in `lab`
    assert (plain["K8S_POD_NAMESPACE"], plain["K8S_POD_NAME"]) == ("lab", "acct-a")


def test_the_pool_default_applies_only_where_the_pod_asks_for_nothing() -> None:
    default = {"type": "superkube-bandwidth", "defaultEgressRate": 10**8}
    assert cni_bandwidth.shaped(default)["runtimeConfig"]["bandwidth"]["egressRate"] == 10**8
    assert "defaultEgressRate" not in cni_bandwidth.shaped(default)
    own = cni_bandwidth.shaped({**default, "runtimeConfig": capabilities("10M")})
    assert own["runtimeConfig"]["bandwidth"]["egressRate"] == 10**7
    assert "runtimeConfig" not in cni_bandwidth.shaped({"type": "superkube-bandwidth"})


def test_the_plugin_answers_a_bad_config_with_a_cni_error() -> None:
    proc = subprocess.run(
        [sys.executable, cni_bandwidth.__file__],
        input=json.dumps({"cniVersion": "1.0.0", "defaultEgressRate": "10Mbps"}),
        capture_output=True,
        text=True,
        env={"CNI_COMMAND": "ADD", "CNI_PATH": "/nonexistent"},
        timeout=30,
    )
    assert proc.returncode == 1
    err = json.loads(proc.stdout)
    assert err["code"] == 7 and "'10Mbps' is not a rate" in err["msg"]


def test_with_nothing_to_shape_the_plugin_passes_the_previous_result_on() -> None:
    prev = {"cniVersion": "1.0.0", "ips": [{"address": "10.64.0.44/19", "gateway": "10.64.0.4"}]}
    proc = subprocess.run(
        ["/usr/bin/python3", "-IS", cni_bandwidth.__file__],
        input=json.dumps(
            {"cniVersion": "1.0.0", "name": "superkube", "type": "superkube-bandwidth", "prevResult": prev}
        ),
        capture_output=True,
        text=True,
        env={"CNI_COMMAND": "ADD", "CNI_PATH": "/nonexistent"},
        timeout=30,
    )
    assert proc.returncode == 0, proc.stdout
    assert json.loads(proc.stdout) == prev


def test_the_config_writer_reads_the_tag_the_plan_writes() -> None:
    # cni_config runs alone on nodes, so it names the tag itself; the plan's name is cloudinit's
    assert cni_config.EGRESS_TAG == cloudinit.EGRESS_TAG
