#!/usr/bin/python3 -IS
"""`superkube-pod-accounting`: per-pod mangle rules that count each pod's traffic, for the iptables exporter.

A chained CNI plugin, after `superkube-bandwidth` in the node's conflist. On ADD it gives the pod two
chains of its own in the mangle table, named from a hash of the container ID (`SKPOD-<16 hex>-O` for
what the pod sends, `-I` for what it receives; iptables allows 28 characters), reached from two
shared chains by the pod's IP:

    PREROUTING  -> SUPERKUBE-PODS-OUT -s <pod>/32 -> SKPOD-<h>-O   (every packet the pod sends)
    POSTROUTING -> SUPERKUBE-PODS-IN  -d <pod>/32 -> SKPOD-<h>-I   (every packet the pod receives)

On a ptp node a pod's packets to other hosts and other pods cross FORWARD, but its packets to the
node itself (a host-network pod, the node's own services) go up INPUT and the node's answers come
down OUTPUT. PREROUTING sees every packet that arrives from the pod's veth and POSTROUTING every
packet that leaves towards it, each once, whether routed or local. Each pod chain counts, per
internal CIDR, the traffic to (or from) the cluster's own ranges, then the rest as internet, with
rules the exporter reads:

    iptables-exporter <cluster> traffic=<internal-out|internet-out|internal-in|internet-in> namespace=<ns> pod=<pod>

The cluster name and the internal CIDRs come from a settings file the iptables_accounting role
writes (the config's `settings`, JSON: {"cluster": ..., "internalCidrs": [...], "lockFile": ...}).
The shared chains are not in that role's rule file (restoring a chain declared there flushes it),
so the node's rule restore neither flushes nor zeroes a pod's counters; the role's hooks make the
shared chains when they are missing and jump to them.

On DEL the pod's dispatch rules and chains go; a DEL for a container this node never saw succeeds.
Every change is one `iptables-restore --noflush` transaction computed from one `iptables-save`,
under an flock on the lock file the role's apply script takes too, since the runtime runs ADD and
DEL for several pods at once. An ADD also removes what a pod of the same IP left behind.

Accounting never stops a pod: one whose CNI_ARGS lack K8S_POD_NAMESPACE or K8S_POD_NAME (or name
something that is not a Kubernetes name), or a node without the settings file, gets its node-level
accounting only and one line on stderr. A comment over iptables' 255 characters has its pod name,
then its namespace, shortened to a prefix and a hash of the whole name. Standard library only, one
file: it runs on nodes as a CNI plugin (Python 3.10 and later).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import ipaddress
import json
import os
import re
import subprocess
import sys
from typing import Any

NAME = "superkube-pod-accounting"
TAG = "iptables-exporter"
TABLE = "mangle"
PODS_OUT = "SUPERKUBE-PODS-OUT"
PODS_IN = "SUPERKUBE-PODS-IN"
HOOKS = (("PREROUTING", PODS_OUT), ("POSTROUTING", PODS_IN))  # iptables_accounting's hooks name them too
PREFIX = "SKPOD-"
CHAIN_MAX = 28  # iptables' longest chain name
COMMENT_MAX = 255  # the comment match's longest comment
DEFAULT_LOCK = "/run/superkube/iptables.lock"
# K8S_POD_NAME is a DNS subdomain, K8S_POD_NAMESPACE a DNS label: nothing else goes into a comment
K8S_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
CLUSTER = re.compile(r"^[a-z][a-z0-9-]*$")


class AccountingError(Exception):
    """iptables refused a change; the message says which."""


def chains(container_id: str) -> tuple[str, str]:
    """The pod's two chains: (what it sends, what it receives)."""
    digest = hashlib.sha256(container_id.encode()).hexdigest()[:16]
    return f"{PREFIX}{digest}-O", f"{PREFIX}{digest}-I"


def cni_args(text: str) -> dict[str, str]:
    """CNI_ARGS ("K=V;K=V") as a dict."""
    out: dict[str, str] = {}
    for part in text.split(";"):
        key, sep, value = part.partition("=")
        if sep and key.strip():
            out[key.strip()] = value.strip()
    return out


def shorten(name: str, room: int) -> str:
    """`name` in at most `room` characters: whole if it fits, else a prefix and 8 hex of its hash."""
    if len(name) <= room:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:8]
    return name[: max(room - 9, 1)].rstrip("-.") + "-" + digest


def comment(cluster: str, traffic: str, namespace: str, pod: str) -> str:
    return f"{TAG} {cluster} traffic={traffic} namespace={namespace} pod={pod}"


def pod_labels(cluster: str, namespace: str, pod: str) -> tuple[str, str]:
    """The namespace and pod labels as the rules carry them: the longest comment fits iptables."""
    fixed = len(comment(cluster, "internet-out", "", ""))
    room = COMMENT_MAX - fixed
    if len(namespace) + len(pod) <= room:
        return namespace, pod
    # the pod name gives way first; the namespace only where even a shortened pod does not fit
    ns = namespace if len(namespace) + 24 <= room else shorten(namespace, room // 2)
    return ns, shorten(pod, room - len(ns))


def read_settings(path: str) -> tuple[str, list[str], str]:
    """(cluster, internal CIDRs, lock file) from the role's settings file; ValueError/OSError if unusable."""
    with open(path) as handle:
        doc = json.load(handle)
    if not isinstance(doc, dict):
        raise ValueError("not a JSON object")
    cluster = doc.get("cluster")
    if not isinstance(cluster, str) or not CLUSTER.match(cluster):
        raise ValueError(f"cluster {cluster!r} is not a cluster name")
    cidrs = doc.get("internalCidrs")
    if not isinstance(cidrs, list) or not cidrs:
        raise ValueError("internalCidrs is not a list of CIDRs")
    internal = [str(ipaddress.IPv4Network(c)) for c in cidrs]
    lock = doc.get("lockFile") or DEFAULT_LOCK
    if not isinstance(lock, str) or not lock.startswith("/"):
        raise ValueError(f"lockFile {lock!r} is not an absolute path")
    return cluster, internal, lock


def pod_ipv4(prev: Any) -> list[str]:
    """The pod's IPv4 addresses from the previous plugin's result."""
    out = []
    for entry in (prev or {}).get("ips") or []:
        address = str((entry or {}).get("address", "")).split("/")[0]
        try:
            if ipaddress.ip_address(address).version == 4:
                out.append(address)
        except ValueError:
            continue
    return out


def pod_rules(
    container_id: str, ips: list[str], cluster: str, internal: list[str], namespace: str, pod: str
) -> list[str]:
    """The pod chains' rules and their dispatch rules, as iptables-restore lines."""
    out_chain, in_chain = chains(container_id)
    ns, name = pod_labels(cluster, namespace, pod)
    lines = []
    for chain, flag, direction in ((out_chain, "-d", "out"), (in_chain, "-s", "in")):
        internal_tag = comment(cluster, f"internal-{direction}", ns, name)
        for cidr in internal:
            lines.append(f'-A {chain} {flag} {cidr} -m comment --comment "{internal_tag}" -j RETURN')
        internet_tag = comment(cluster, f"internet-{direction}", ns, name)
        lines.append(f'-A {chain} -m comment --comment "{internet_tag}" -j RETURN')
    for ip in ips:
        lines.append(f"-A {PODS_OUT} -s {ip}/32 -j {out_chain}")
        lines.append(f"-A {PODS_IN} -d {ip}/32 -j {in_chain}")
    return lines


def parse_saved(saved: str) -> tuple[set[str], list[str]]:
    """The chains and the `-A` rules of one table's iptables-save output."""
    names, rules = set(), []
    for line in saved.splitlines():
        if line.startswith(":"):
            names.add(line[1:].split()[0])
        elif line.startswith("-A "):
            rules.append(line)
    return names, rules


def _dispatch(rule: str) -> tuple[str, str, str] | None:
    """(shared chain, address, target) of a dispatch rule `-A SUPERKUBE-PODS-* -s|-d ADDR -j SKPOD-...`."""
    words = rule.split()
    if len(words) == 6 and words[1] in (PODS_OUT, PODS_IN) and words[2] in ("-s", "-d") and words[4] == "-j":
        return words[1], words[3], words[5]
    return None


def add_transaction(saved: str, container_id: str, ips: list[str], rules: list[str]) -> str:
    """The one iptables-restore input that puts the pod's rules in place over `saved`."""
    names, existing = parse_saved(saved)
    own = set(chains(container_id))
    addresses = {f"{ip}/32" for ip in ips}
    lines = [f"*{TABLE}"]
    lines += [f":{chain} - [0:0]" for chain in (PODS_OUT, PODS_IN) if chain not in names]
    for hook, target in HOOKS:
        jumps = existing.count(f"-A {hook} -j {target}")
        if jumps == 0:
            lines.append(f"-I {hook} 1 -j {target}")
        lines += [f"-D {hook} -j {target}"] * max(jumps - 1, 0)
    stale: set[str] = set()
    for rule in existing:
        found = _dispatch(rule)
        if found is None or not found[2].startswith(PREFIX):
            continue
        # this pod's own (an ADD again: re-made below), or a pod of the same IP that was never DELeted
        if found[2] in own or found[1] in addresses:
            lines.append("-D" + rule[2:])
            if found[2] not in own:
                stale.add(found[2])
    for chain in sorted(stale):
        if chain in names:
            lines += [f"-F {chain}", f"-X {chain}"]
    for chain in sorted(own):
        lines.append(f"-F {chain}" if chain in names else f":{chain} - [0:0]")
    return "\n".join([*lines, *rules, "COMMIT", ""])


def del_transaction(saved: str, container_id: str) -> str | None:
    """The iptables-restore input that removes the pod's rules and chains, or None: nothing to remove."""
    names, existing = parse_saved(saved)
    own = set(chains(container_id))
    lines = [f"*{TABLE}"]
    for rule in existing:
        found = _dispatch(rule)
        if found is not None and found[2] in own:
            lines.append("-D" + rule[2:])
    for chain in sorted(own & names):
        lines += [f"-F {chain}", f"-X {chain}"]
    if len(lines) == 1:
        return None
    return "\n".join([*lines, "COMMIT", ""])


class Locked:
    """An exclusive flock on `path` (made if missing) for the life of the `with`."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.fd = -1

    def __enter__(self) -> Locked:
        os.makedirs(os.path.dirname(self.path) or "/", exist_ok=True)
        self.fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600)
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc: object) -> None:
        os.close(self.fd)  # closing the last descriptor releases the lock


def _iptables(args: list[str], stdin: str | None = None) -> str:
    try:
        proc = subprocess.run(args, input=stdin, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise AccountingError(f"{args[0]}: {exc}") from None
    if proc.returncode != 0:
        raise AccountingError(f"{' '.join(args)}: {proc.stderr.strip() or f'exit status {proc.returncode}'}")
    return proc.stdout


def save() -> str:
    return _iptables(["iptables-save", "-t", TABLE])


def restore(text: str) -> None:
    _iptables(["iptables-restore", "--wait", "--noflush"], text)


def log(container_id: str, message: str) -> None:
    print(f"{NAME}: container {container_id[:12] or '?'}: {message}", file=sys.stderr)


def add(conf: dict[str, Any], container_id: str, args: dict[str, str]) -> None:
    namespace, pod = args.get("K8S_POD_NAMESPACE", ""), args.get("K8S_POD_NAME", "")
    if not (K8S_NAME.match(namespace) and len(namespace) <= 63 and K8S_NAME.match(pod)):
        log(
            container_id,
            f"CNI_ARGS name no pod (K8S_POD_NAMESPACE={namespace!r}, K8S_POD_NAME={pod!r}); "
            "its traffic is counted at node level only",
        )
        return
    try:
        cluster, internal, lock = read_settings(str(conf.get("settings")))
    except (OSError, ValueError) as exc:
        log(container_id, f"{namespace}/{pod}: settings {conf.get('settings')}: {exc}; node level only")
        return
    ips = pod_ipv4(conf.get("prevResult"))
    if not ips:
        log(container_id, f"{namespace}/{pod}: the previous result holds no IPv4 address; node level only")
        return
    rules = pod_rules(container_id, ips, cluster, internal, namespace, pod)
    with Locked(lock):
        restore(add_transaction(save(), container_id, ips, rules))


def delete(conf: dict[str, Any], container_id: str) -> None:
    lock = DEFAULT_LOCK  # a node without settings made no pod chains: look anyway, under the default lock
    with contextlib.suppress(OSError, ValueError):
        lock = read_settings(str(conf.get("settings")))[2]
    with Locked(lock):
        text = del_transaction(save(), container_id)
        if text is not None:
            restore(text)


def _error(conf: dict[str, Any], code: int, msg: str) -> int:
    print(json.dumps({"cniVersion": conf.get("cniVersion", "1.0.0"), "code": code, "msg": msg}))
    return 1


def main() -> int:
    raw = sys.stdin.read()
    try:
        conf = json.loads(raw)
        if not isinstance(conf, dict):
            raise ValueError("not an object")
    except ValueError as exc:
        return _error({}, 6, f"{NAME}: the network configuration is not JSON ({exc})")
    command = os.environ.get("CNI_COMMAND", "")
    if command == "VERSION":
        print(json.dumps({"cniVersion": "1.0.0", "supportedVersions": ["0.3.1", "0.4.0", "1.0.0"]}))
        return 0
    if command not in ("ADD", "DEL"):
        return 0  # CHECK, GC, STATUS: counting has nothing the pod's network depends on
    if not isinstance(conf.get("settings"), str):
        return _error(conf, 7, f'{NAME}: the configuration names no settings file ("settings")')
    container_id = os.environ.get("CNI_CONTAINERID", "")
    if not container_id:
        return _error(conf, 4, f"{NAME}: CNI_CONTAINERID is not set")
    try:
        if command == "ADD":
            add(conf, container_id, cni_args(os.environ.get("CNI_ARGS", "")))
        else:
            delete(conf, container_id)
    except (AccountingError, OSError) as exc:
        return _error(conf, 999, f"{NAME}: {exc}")
    if command == "ADD":
        # a chained plugin passes the previous result on
        print(json.dumps(conf.get("prevResult") or {"cniVersion": conf.get("cniVersion", "1.0.0")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
