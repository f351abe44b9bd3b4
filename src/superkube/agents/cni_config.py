#!/usr/bin/python3
"""`superkube-cni-config`: at boot, write the node's CNI network from its NIC's IPs in instance metadata.

A node's NIC carries 1 + pod_ips_per_node IP configurations (the plan's `primary` and `pod-NNN`).
Azure's Instance Metadata Service lists them, first the node's own:

    GET http://169.254.169.254/metadata/instance/network?api-version=2021-02-01   (header Metadata: true)
    {"interface": [{"ipv4": {"ipAddress": [{"privateIpAddress": "10.0.0.4", ...}, ...],
                             "subnet": [{"address": "10.0.0.0", "prefix": "20"}]}, ...}]}

The network written gives each pod one of the secondary IPs: `ptp` (a veth pair, the pod's /32
routed to it on the node, the node's own address as the pod's gateway, no masquerade), `host-local`
IPAM over exactly those IPs with its state under /run (a reboot releases every allocation, as it
ends every pod), then `superkube-bandwidth` (egress limits; the pool's default from the scale set's
`superkube-egress-limit` tag), `superkube-pod-accounting` (per-pod traffic counters, its settings
from the file the iptables_accounting role writes) and `portmap`.

The file is written whole or not at all: any fault in the metadata is one line on stderr (the
journal) naming the field, exit status 1, and whatever config was there before stays as it was.
Standard library only: it runs on the node before anything else of ours is there.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

IMDS = "http://169.254.169.254/metadata/instance"
API_VERSION = "2021-02-01"
NETWORK_NAME = "superkube"
EGRESS_TAG = (
    "superkube-egress-limit"  # bits/s: superkube.cluster.cloudinit.EGRESS_TAG (a test holds them equal)
)
DEFAULT_OUT = "/etc/cni/net.d/10-superkube.conflist"
DEFAULT_DATA_DIR = "/run/superkube/cni/networks"  # tmpfs: allocations end with the boot
# written by the iptables_accounting role (its iptables_accounting_pod_settings_file)
DEFAULT_ACCOUNTING_SETTINGS = "/etc/superkube/iptables/pod-accounting.json"


class MetadataError(Exception):
    """The metadata service gave nothing usable; the message names the field."""


@dataclass(frozen=True)
class NodeAddresses:
    primary: str
    subnet: str  # CIDR of the NIC's subnet
    pod_ips: tuple[str, ...]


def _get(url: str, timeout: float) -> Any:
    request = urllib.request.Request(url, headers={"Metadata": "true"})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        body = response.read()
    try:
        return json.loads(body)
    except ValueError:
        raise MetadataError(f"{url}: the answer is not JSON ({body[:60]!r})") from None


def fetch(path: str, *, base: str = IMDS, tries: int = 5, timeout: float = 5.0) -> Any:
    """GET one metadata document, retrying while the service is not up yet (early boot)."""
    url = f"{base}{path}?api-version={API_VERSION}"
    last = ""
    for attempt in range(tries):
        try:
            return _get(url, timeout)
        except urllib.error.HTTPError as exc:
            last = f"HTTP {exc.code} {exc.reason}"
            if exc.code < 500:
                break  # the service answered: asking again will not change it
        except (urllib.error.URLError, OSError) as exc:
            last = str(getattr(exc, "reason", exc))
        if attempt + 1 < tries:
            time.sleep(min(0.5 * 2**attempt, 4.0))
    raise MetadataError(f"{url}: {last}; is this an Azure VM (or a lab host) with instance metadata?")


def _field(doc: Any, *keys: str | int) -> Any:
    """doc[k1][k2]..., or MetadataError naming the first key that is not there."""
    value = doc
    where = "network"
    for key in keys:
        where += f"[{key}]" if isinstance(key, int) else f".{key}"
        try:
            value = value[key]
        except (KeyError, IndexError, TypeError):
            raise MetadataError(f"{where}: missing from the metadata") from None
    return value


def parse_network(doc: Any) -> NodeAddresses:
    """The node's primary IP, its subnet and the pod IPs from the `network` document."""
    ips = _field(doc, "interface", 0, "ipv4", "ipAddress")
    if not isinstance(ips, list) or not ips:
        raise MetadataError("network.interface[0].ipv4.ipAddress: empty; the NIC lists no IP")
    addresses = []
    for i, _entry in enumerate(ips):
        value = _field(doc, "interface", 0, "ipv4", "ipAddress", i, "privateIpAddress")
        try:
            addresses.append(str(ipaddress.IPv4Address(value)))
        except (ipaddress.AddressValueError, ValueError):
            raise MetadataError(
                f"network.interface[0].ipv4.ipAddress[{i}].privateIpAddress: {value!r} is not an IPv4 address"
            ) from None
    address = _field(doc, "interface", 0, "ipv4", "subnet", 0, "address")
    prefix = _field(doc, "interface", 0, "ipv4", "subnet", 0, "prefix")
    try:
        subnet = ipaddress.IPv4Network(f"{address}/{prefix}")
    except ValueError:
        raise MetadataError(
            f"network.interface[0].ipv4.subnet[0]: {address!r}/{prefix!r} is not an IPv4 subnet"
        ) from None
    for i, ip in enumerate(addresses):
        if ipaddress.IPv4Address(ip) not in subnet:
            raise MetadataError(
                f"network.interface[0].ipv4.ipAddress[{i}].privateIpAddress: {ip} is outside the subnet {subnet}"
            )
    if len(set(addresses)) != len(addresses):
        raise MetadataError("network.interface[0].ipv4.ipAddress: an address is listed twice")
    if len(addresses) < 2:
        raise MetadataError(
            "network.interface[0].ipv4.ipAddress: only the node's own IP; the NIC has no pod IPs "
            "(pod_ips_per_node IP configurations)"
        )
    return NodeAddresses(addresses[0], str(subnet), tuple(addresses[1:]))


def egress_default(tags: Any) -> int | None:
    """The pool's default egress rate (bits/s) from the scale set's tags, or None."""
    if not isinstance(tags, list):
        raise MetadataError("compute.tagsList: not a list")
    for i, tag in enumerate(tags):
        if isinstance(tag, dict) and tag.get("name") == EGRESS_TAG:
            value = str(tag.get("value", ""))
            if not value.isdigit() or int(value) < 1:
                raise MetadataError(f"compute.tagsList[{i}] {EGRESS_TAG}: {value!r} is not bits per second")
            return int(value)
    return None


def ranges(pod_ips: tuple[str, ...], subnet: str, gateway: str) -> list[dict[str, str]]:
    """host-local ranges covering exactly `pod_ips`, contiguous runs merged (one range set)."""
    ordered = sorted(ipaddress.IPv4Address(ip) for ip in pod_ips)
    runs: list[list[ipaddress.IPv4Address]] = []
    for ip in ordered:
        if runs and int(ip) == int(runs[-1][1]) + 1:
            runs[-1][1] = ip
        else:
            runs.append([ip, ip])
    return [{"subnet": subnet, "rangeStart": str(a), "rangeEnd": str(b), "gateway": gateway} for a, b in runs]


def conflist(
    node: NodeAddresses,
    *,
    egress_bits: int | None = None,
    data_dir: str = DEFAULT_DATA_DIR,
    mtu: int = 0,
    accounting_settings: str = DEFAULT_ACCOUNTING_SETTINGS,
) -> dict[str, Any]:
    """The node's CNI network: ptp + host-local over the pod IPs, then egress shaping, per-pod
    accounting and portmap."""
    ptp: dict[str, Any] = {
        "type": "ptp",
        "ipMasq": False,  # pods keep their VNet source IP: no SNAT between pods, nor on the node
        "ipam": {
            "type": "host-local",
            "dataDir": data_dir,
            "ranges": [ranges(node.pod_ips, node.subnet, node.primary)],
            "routes": [{"dst": "0.0.0.0/0"}],
        },
    }
    if mtu:
        ptp["mtu"] = mtu
    bandwidth: dict[str, Any] = {"type": "superkube-bandwidth", "capabilities": {"bandwidth": True}}
    if egress_bits:
        bandwidth["defaultEgressRate"] = egress_bits
    return {
        "cniVersion": "1.0.0",
        "name": NETWORK_NAME,
        "plugins": [
            ptp,
            bandwidth,
            {"type": "superkube-pod-accounting", "settings": accounting_settings},
            {"type": "portmap", "capabilities": {"portMappings": True}, "snat": True},
        ],
    }


def write_whole(path: Path, text: str) -> None:
    """Write by rename: readers see the old file or the new one, never part of one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="superkube-cni-config", description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=DEFAULT_OUT, help="the conflist to write")
    parser.add_argument("--metadata", default=IMDS, help="instance metadata base URL")
    parser.add_argument("--data-dir", default=DEFAULT_DATA_DIR, help="host-local's allocation state")
    parser.add_argument("--mtu", type=int, default=0, help="pod interface MTU (0: the plugin's default)")
    parser.add_argument("--tries", type=int, default=5, help="metadata requests before giving up")
    parser.add_argument(
        "--pod-accounting-settings",
        default=DEFAULT_ACCOUNTING_SETTINGS,
        help="the per-pod accounting step's settings file (the iptables_accounting role writes it)",
    )
    args = parser.parse_args(argv)
    out = Path(args.out)
    try:
        node = parse_network(fetch("/network", base=args.metadata, tries=args.tries))
        egress = egress_default(fetch("/compute/tagsList", base=args.metadata, tries=args.tries))
        network = conflist(
            node,
            egress_bits=egress,
            data_dir=args.data_dir,
            mtu=args.mtu,
            accounting_settings=args.pod_accounting_settings,
        )
        text = json.dumps(network, indent=2)
        write_whole(out, text + "\n")
    except (MetadataError, OSError) as exc:
        kept = "kept the previous one" if out.exists() else "none written"
        print(f"superkube-cni-config: {exc} ({out}: {kept})", file=sys.stderr)
        return 1
    print(
        f"superkube-cni-config: {out}: {len(node.pod_ips)} pod IPs in {node.subnet}, gateway {node.primary}, "
        f"default egress {f'{egress} bit/s' if egress else 'unlimited'}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
