#!/usr/bin/python3
"""A container runtime's CNI half, for the lab's pod tests and benchmarks: pods without a kubelet.

It does what containerd's CRI plugin does through libcni for one pod sandbox, by the CNI spec:
a network namespace per pod; ADD runs each plugin of the conflist in order with CNI_COMMAND,
CNI_CONTAINERID, CNI_NETNS, CNI_IFNAME, CNI_PATH and CNI_ARGS, the plugin's config on stdin with
`name`, `cniVersion`, the previous plugin's result as `prevResult` and `runtimeConfig` holding the
capabilities the plugin declares; the result is cached (/var/lib/cni/results, libcni's place and
shape) for DEL, which runs the plugins in reverse with the cached result and the same CNI_ARGS.
CNI_ARGS name the pod as the kubelet's runtime does (K8S_POD_NAMESPACE, K8S_POD_NAME): namespace
`lab` and the pod's own name unless --namespace and --name say otherwise. A failed ADD is torn down
with DEL, as the CRI plugin does. The `kubernetes.io/egress-bandwidth` annotation becomes the
`bandwidth` capability as the CRI plugin writes it: the rate in bits/s and a burst of 2**32 - 1.

Standard library only: it is copied to lab hosts (beside superkube/model/rates.py) and run there as root.

    cnirun.py add POD [--egress 10M] [--port 8080:80] [--conflist F]   -> the result JSON
    cnirun.py add POD --namespace NS --name NAME                       -> a pod named NS/NAME
    cnirun.py del POD [--conflist F]
    cnirun.py cycles N [--egress 10M] [--port 8080:80] [--alternate]     -> {"cycles": N, "seconds": ...}
    cnirun.py bench N [--conflist F]                                   -> ADD latencies (namespace included)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

try:
    from superkube.model.rates import parse_rate
except ImportError:  # on a lab host, beside rates.py
    from rates import parse_rate

CONFLIST = "/etc/cni/net.d/10-superkube.conflist"
CACHE = Path("/var/lib/cni/results")
CRI_BURST = 2**32 - 1  # the burst the CRI plugin pairs with an annotation's rate
IFNAME = "eth0"
NAMESPACE = "lab"  # the Kubernetes namespace a pod is in unless --namespace names another


class CNIError(Exception):
    pass


def cni_path(conf_path: str) -> str:
    """The plugin directory: CNI_PATH, else the one holding our shaping plugin."""
    if os.environ.get("CNI_PATH"):
        return os.environ["CNI_PATH"]
    for candidate in ("/opt/cni/bin", "/usr/lib/cni"):
        if os.path.exists(os.path.join(candidate, "superkube-bandwidth")):
            return candidate
    return "/usr/lib/cni"


def capabilities(egress: str | None = None, ports: list[str] | None = None) -> dict[str, Any]:
    """The runtime's capability args for a pod's annotations and port mappings."""
    caps: dict[str, Any] = {}
    if egress:
        # spelled as containerd's CRI plugin sends it: every field, capitalized (a Go struct's names)
        caps["bandwidth"] = {
            "IngressRate": 0,
            "IngressBurst": 0,
            "EgressRate": parse_rate(egress),
            "EgressBurst": CRI_BURST,
        }
    if ports:
        caps["portMappings"] = [
            {"hostPort": int(h), "containerPort": int(c), "protocol": "tcp"}
            for h, _, c in (p.partition(":") for p in ports)
        ]
    return caps


def _plugin_conf(network: dict[str, Any], plugin: dict[str, Any], prev: Any, caps: dict[str, Any]) -> bytes:
    conf = {**plugin, "name": network["name"], "cniVersion": network["cniVersion"]}
    wanted = {k: v for k, v in caps.items() if (plugin.get("capabilities") or {}).get(k)}
    if wanted:
        conf["runtimeConfig"] = wanted
    if prev is not None:
        conf["prevResult"] = prev
    return json.dumps(conf).encode()


def _exec(command: str, plugin: dict[str, Any], stdin: bytes, env: dict[str, str]) -> Any:
    path = next(
        (
            os.path.join(d, plugin["type"])
            for d in env["CNI_PATH"].split(":")
            if os.path.exists(os.path.join(d, plugin["type"]))
        ),
        None,
    )
    if path is None:
        raise CNIError(f"failed to find plugin {plugin['type']!r} in path {env['CNI_PATH']}")
    proc = subprocess.run(
        [path], input=stdin, capture_output=True, env={**os.environ, **env, "CNI_COMMAND": command}
    )
    if proc.returncode != 0:
        try:
            err = json.loads(proc.stdout)
            message = f"plugin type={plugin['type']!r} failed ({command}): {err.get('msg')}" + (
                f": {err['details']}" if err.get("details") else ""
            )
        except ValueError:
            message = f"plugin type={plugin['type']!r} failed ({command}): {(proc.stderr or proc.stdout).decode().strip()}"
        raise CNIError(message)
    return json.loads(proc.stdout) if proc.stdout.strip() else None


def cni_args(pod: str, namespace: str = NAMESPACE, name: str | None = None) -> str:
    """CNI_ARGS as the kubelet's runtime passes them for the pod `namespace`/`name` (default: the
    sandbox's own name) whose sandbox is `pod`."""
    return (
        f"IgnoreUnknown=1;K8S_POD_NAMESPACE={namespace};K8S_POD_NAME={name or pod};"
        f"K8S_POD_INFRA_CONTAINER_ID={pod}"
    )


def _env(pod: str, netns: str, path: str, args: str) -> dict[str, str]:
    return {
        "CNI_CONTAINERID": pod,
        "CNI_NETNS": netns,
        "CNI_IFNAME": IFNAME,
        "CNI_PATH": path,
        "CNI_ARGS": args,
    }


def _cache_file(network: str, pod: str) -> Path:
    return CACHE / f"{network}-{pod}-{IFNAME}"


def add(
    pod: str, conflist: str = CONFLIST, caps: dict[str, Any] | None = None, args: str | None = None
) -> Any:
    """Create the pod's namespace and run the chain's ADD with CNI_ARGS `args` (default: the pod
    named `pod` in namespace `lab`); on failure, tear down and raise."""
    network = json.loads(Path(conflist).read_text())
    caps = caps or {}
    args = cni_args(pod) if args is None else args
    netns = f"/run/netns/{pod}"
    subprocess.run(["ip", "netns", "add", pod], check=True, capture_output=True)
    subprocess.run(["ip", "-n", pod, "link", "set", "lo", "up"], check=True, capture_output=True)
    env = _env(pod, netns, cni_path(conflist), args)
    prev: Any = None
    try:
        for plugin in network["plugins"]:
            prev = _exec("ADD", plugin, _plugin_conf(network, plugin, prev, caps), env)
    except CNIError:
        _teardown(network, pod, env, prev, caps)
        raise
    CACHE.mkdir(parents=True, exist_ok=True)
    _cache_file(network["name"], pod).write_text(
        json.dumps(
            {
                "kind": "cniCacheV1",
                "containerId": pod,
                "ifName": IFNAME,
                "networkName": network["name"],
                "cniArgs": [p.split("=", 1) for p in args.split(";") if "=" in p],
                "capabilityArgs": caps,
                "result": prev,
            }
        )
    )
    return prev


def _teardown(
    network: dict[str, Any], pod: str, env: dict[str, str], prev: Any, caps: dict[str, Any]
) -> list[str]:
    errors = []
    for plugin in reversed(network["plugins"]):
        try:
            _exec("DEL", plugin, _plugin_conf(network, plugin, prev, caps), env)
        except CNIError as exc:
            errors.append(str(exc))
    subprocess.run(["ip", "netns", "del", pod], capture_output=True)
    _cache_file(network["name"], pod).unlink(missing_ok=True)
    return errors


def delete(pod: str, conflist: str = CONFLIST) -> None:
    """DEL in reverse with the cached result, then remove the namespace (DEL is idempotent)."""
    network = json.loads(Path(conflist).read_text())
    cached = _cache_file(network["name"], pod)
    entry = json.loads(cached.read_text()) if cached.exists() else {}
    args = ";".join("=".join(p) for p in entry["cniArgs"]) if entry.get("cniArgs") else cni_args(pod)
    errors = _teardown(
        network,
        pod,
        _env(pod, f"/run/netns/{pod}", cni_path(conflist), args),
        entry.get("result"),
        entry.get("capabilityArgs") or {},
    )
    if errors:
        raise CNIError("; ".join(errors))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="cnirun.py")
    parser.add_argument("command", choices=["add", "del", "cycles", "bench"])
    parser.add_argument("arg", help="pod name, or a count for cycles and bench")
    parser.add_argument("--conflist", default=CONFLIST)
    parser.add_argument("--egress", help="the pod's kubernetes.io/egress-bandwidth annotation")
    parser.add_argument("--port", action="append", default=[], help="HOST:CONTAINER port mapping")
    parser.add_argument("--alternate", action="store_true", help="cycles: capabilities on every other pod")
    parser.add_argument("--namespace", default=NAMESPACE, help="add: the pod's Kubernetes namespace")
    parser.add_argument("--name", help="add: the pod's Kubernetes name (default: POD)")
    args = parser.parse_args(argv)
    caps = capabilities(args.egress, args.port)
    try:
        if args.command == "add":
            print(
                json.dumps(add(args.arg, args.conflist, caps, cni_args(args.arg, args.namespace, args.name)))
            )
        elif args.command == "del":
            delete(args.arg, args.conflist)
        elif args.command == "cycles":
            start = time.monotonic()
            for i in range(int(args.arg)):
                # --alternate: the capabilities (shaping, port mappings) on every other pod only
                add(f"cycle-{i}", args.conflist, {} if args.alternate and i % 2 else caps)
                delete(f"cycle-{i}", args.conflist)
            print(json.dumps({"cycles": int(args.arg), "seconds": round(time.monotonic() - start, 2)}))
        else:
            latencies = []  # one pod after another: ADD timed, then DEL (a node holds few pod IPs)
            for i in range(int(args.arg)):
                start = time.perf_counter()
                add(f"bench-{i}", args.conflist, caps)
                latencies.append(time.perf_counter() - start)
                delete(f"bench-{i}", args.conflist)
            print(json.dumps({"add_seconds": latencies}))
    except CNIError as exc:
        print(f"cnirun: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
