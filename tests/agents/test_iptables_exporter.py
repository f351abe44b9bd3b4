"""The iptables exporter on real iptables rules, in a network namespace the test makes."""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from superkube.agents import iptables_exporter as exporter

RULES = """*mangle
:ACCT - [0:0]
-A INPUT -j ACCT
-A ACCT -s 10.0.0.0/8 -m comment --comment "internal, not exported" -j RETURN
-A ACCT -m comment --comment "iptables-exporter flagship traffic=internet-in" -j RETURN
-A ACCT -p tcp -m comment --comment "iptables-exporter flagship traffic=internet-in" -j RETURN
-A ACCT -m comment --comment "iptables-exporter flagship traffic=internet-out direction=egress" -j RETURN
-A ACCT -m comment --comment iptables-exporter-lookalike -j RETURN
COMMIT
"""


@pytest.fixture(scope="module")
def netns() -> Iterator[str]:
    name = f"skt-{uuid.uuid4().hex[:8]}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        subprocess.run(["ip", "netns", "exec", name, "iptables-restore"], input=RULES, text=True, check=True)
        subprocess.run(["ip", "-n", name, "link", "set", "lo", "up"], check=True)
        yield name
    finally:
        subprocess.run(["ip", "netns", "del", name], check=True)


@pytest.fixture(scope="module")
def save_in_netns(netns: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    script = tmp_path_factory.mktemp("bin") / "iptables-save"
    script.write_text(f'#!/bin/sh\nexec ip netns exec {netns} iptables-save "$@"\n')
    script.chmod(0o755)
    return str(script)


def families(text: bytes) -> dict[str, list]:
    return {f.name: f.samples for f in text_string_to_metric_families(text.decode())}


def test_scrape_exports_tagged_rules_with_their_labels(netns: str, save_in_netns: str) -> None:
    ping = [
        "ip",
        "netns",
        "exec",
        netns,
        "python3",
        "-c",
        "import socket; s=socket.socket(socket.AF_INET, socket.SOCK_DGRAM); [s.sendto(b'x'*100, ('127.0.0.1', 9)) for _ in range(3)]",
    ]
    subprocess.run(ping, check=True)
    metrics = families(exporter.Exporter(["mangle"], save_in_netns).scrape())
    rules = {tuple(sorted(s.labels.items())): s.value for s in metrics["iptables_rule_bytes"]}
    internet_in = (
        ("chain", "ACCT"),
        ("cluster", "flagship"),
        ("table", "mangle"),
        ("traffic", "internet-in"),
    )
    internet_out = (
        ("chain", "ACCT"),
        ("cluster", "flagship"),
        ("direction", "egress"),
        ("table", "mangle"),
        ("traffic", "internet-out"),
    )
    assert set(rules) == {internet_in, internet_out}, (
        "untagged and look-alike rules are not exported; equal labels are summed"
    )
    assert rules[internet_in] >= 3 * 128, (
        "loopback traffic passed the tagged rule (only the first of two matches, then RETURN)"
    )
    assert [s.value for s in metrics["iptables_scrape_success"]] == [1.0]
    assert [s.value for s in metrics["iptables_tagged_rules"]] == [2.0]
    assert metrics["iptables_scrape_duration_seconds"][0].value > 0


def test_a_failing_iptables_save_is_reported_not_raised(tmp_path: Path) -> None:
    broken = tmp_path / "iptables-save"
    broken.write_text("#!/bin/sh\necho 'can not read' >&2\nexit 1\n")
    broken.chmod(0o755)
    metrics = families(exporter.Exporter(["mangle"], str(broken)).scrape())
    assert [s.value for s in metrics["iptables_scrape_success"]] == [0.0]
    assert "iptables_rule_bytes" not in metrics


def test_parse_sums_equal_labels_and_escapes_values() -> None:
    out = exporter.parse(
        "mangle",
        b'[1:10] -A C -m comment --comment "iptables-exporter c k=a\\\\b" -j RETURN\n'
        b'[2:20] -A C -m comment --comment "iptables-exporter c k=a\\\\b" -j RETURN\n'
        b'[5:50] -A D -m comment --comment "iptables-exporter c bad-key=1 k=v" -j RETURN\n',
    )
    assert out == {
        'table="mangle",chain="C",cluster="c",k="a\\\\\\\\b"': [3, 30],
        'table="mangle",chain="D",cluster="c",k="v"': [5, 50],
    }
    text = exporter.render(out)
    parsed = {f.name: f for f in text_string_to_metric_families(text)}
    assert parsed["iptables_rule_packets"].type == "counter"
    assert sorted(s.value for s in parsed["iptables_rule_packets"].samples) == [3, 5]


def test_the_cli_rejects_a_bad_listen_address() -> None:
    with pytest.raises(SystemExit) as exc:
        exporter.main(["--listen", "nowhere"])
    assert exc.value.code == 2
