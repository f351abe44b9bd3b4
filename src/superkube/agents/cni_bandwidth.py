#!/usr/bin/python3 -IS
"""`superkube-bandwidth`: the CNI bandwidth plugin with a burst that lets a pod's egress limit hold.

The kubelet (through the container runtime's CRI plugin) turns the `kubernetes.io/egress-bandwidth`
pod annotation into the bandwidth capability `{"egressRate": <bits/s>, "egressBurst": 2**32 - 1}`.
The standard bandwidth plugin builds a token bucket (tc tbf) from that pair, and a bucket of 4 Gbit
lets the first half gigabyte of every flow through at line rate; its buffer arithmetic also works in
32 bits, which that burst overflows. Either way the limit does not hold for the transfers a limit is
meant for.

This plugin sits where the bandwidth plugin would in the chain (capabilities `bandwidth`), bounds
each burst to what the rate needs -- 10 ms of the rate, at least 64 KiB so one GSO segment fits --
fills in the node pool's default egress rate (`defaultEgressRate`, bits/s) for pods that ask for
none, and hands the result to the standard `bandwidth` plugin found on CNI_PATH, which does the
shaping (ifb device, tbf) and its own clean-up on DEL.

Standard library only, one file: it runs on nodes as a CNI plugin. Rates reach it as whole bits per
second (the CRI plugin converts the annotation; `cni_config` writes `defaultEgressRate` from the pool's
tag); the annotation's grammar itself is `superkube.model.rates`.
"""

from __future__ import annotations

import json
import os
import sys
from decimal import Decimal
from typing import Any

PLUGIN = "bandwidth"  # the standard plugin this one hands over to
BURST_SECONDS = Decimal("0.01")  # the bucket holds 10 ms of the rate ...
MIN_BURST_BITS = 64 * 1024 * 8  # ... and never less than one 64 KiB GSO segment


def whole_rate(value: Any) -> int:
    """`defaultEgressRate` as the config writer writes it: a whole, positive number of bits/s."""
    text = str(value).strip()
    if isinstance(value, bool) or not text.isdigit() or int(text) == 0:
        raise ValueError(f"{value!r} is not a rate: defaultEgressRate is a whole number of bits per second")
    return int(text)


def bounded_burst(rate: int) -> int:
    """The burst, in bits, this plugin gives a rate of `rate` bits/s."""
    return max(MIN_BURST_BITS, int(rate * BURST_SECONDS))


FIELDS = ("ingressRate", "ingressBurst", "egressRate", "egressBurst")


def canonical(bandwidth: dict[str, Any]) -> dict[str, Any]:
    """The runtime's bandwidth capability with its fields under their CNI names.

    The standard plugin (Go) matches JSON keys without regard to case, and runtimes spell them either
    way: containerd's CRI plugin sends {"IngressRate": 0, "IngressBurst": 0, "EgressRate": <rate>,
    "EgressBurst": 4294967295} (a Go struct without JSON names). Read only as CNI spells them, the rate
    would go unseen here and the unbounded burst straight through to the plugin."""
    out: dict[str, Any] = {}
    for key, value in bandwidth.items():
        name = next((f for f in FIELDS if f.lower() == key.lower()), key)
        if name not in out or key == name:  # both spellings: CNI's own wins
            out[name] = value
    return out


def shaped(conf: dict[str, Any]) -> dict[str, Any]:
    """The configuration the standard bandwidth plugin gets for this plugin's `conf`."""
    out = {k: v for k, v in conf.items() if k not in ("defaultEgressRate",)}
    out["type"] = PLUGIN
    runtime = dict(conf.get("runtimeConfig") or {})
    asked = canonical(dict(runtime.get("bandwidth") or {}))
    default = conf.get("defaultEgressRate")
    if default and not asked.get("egressRate"):
        asked["egressRate"] = int(default)
    for direction in ("egress", "ingress"):
        rate = int(asked.get(f"{direction}Rate") or 0)
        if rate:
            burst = int(asked.get(f"{direction}Burst") or 0)
            asked[f"{direction}Burst"] = min(burst, bounded_burst(rate)) if burst else bounded_burst(rate)
        else:
            asked.pop(f"{direction}Rate", None)
            asked.pop(f"{direction}Burst", None)
    if asked:
        runtime["bandwidth"] = asked
    else:
        runtime.pop("bandwidth", None)
    if runtime:
        out["runtimeConfig"] = runtime
    else:
        out.pop("runtimeConfig", None)
    return out


def _error(conf: dict[str, Any], code: int, msg: str) -> int:
    print(json.dumps({"cniVersion": conf.get("cniVersion", "1.0.0"), "code": code, "msg": msg}))
    return 1


def _find_plugin() -> str | None:
    for directory in os.environ.get("CNI_PATH", "").split(os.pathsep):
        candidate = os.path.join(directory, PLUGIN)
        if directory and os.access(candidate, os.X_OK):
            return candidate
    return None


def main() -> int:
    raw = sys.stdin.read()
    try:
        conf = json.loads(raw)
        if not isinstance(conf, dict):
            raise ValueError("not an object")
    except ValueError as exc:
        return _error({}, 6, f"superkube-bandwidth: the network configuration is not JSON ({exc})")
    if os.environ.get("CNI_COMMAND") == "VERSION":
        print(json.dumps({"cniVersion": "1.0.0", "supportedVersions": ["0.3.1", "0.4.0", "1.0.0"]}))
        return 0
    try:
        if conf.get("defaultEgressRate") is not None:
            conf["defaultEgressRate"] = whole_rate(conf["defaultEgressRate"])
        forwarded = shaped(conf)
    except (TypeError, ValueError) as exc:
        return _error(conf, 7, f"superkube-bandwidth: {exc}")
    if os.environ.get("CNI_COMMAND") == "ADD" and "bandwidth" not in forwarded.get("runtimeConfig", {}):
        # nothing to shape: a chained plugin with nothing to do passes the previous result on
        print(json.dumps(conf.get("prevResult") or {"cniVersion": conf.get("cniVersion", "1.0.0")}))
        return 0
    plugin = _find_plugin()
    if plugin is None:
        return _error(
            conf, 7, f"superkube-bandwidth: no {PLUGIN} plugin on CNI_PATH; install the CNI plugins"
        )
    import subprocess  # only here: most pods ask for no shaping, and every ADD pays for imports

    proc = subprocess.run([plugin], input=json.dumps(forwarded), capture_output=True, text=True)
    sys.stdout.write(proc.stdout)
    sys.stderr.write(proc.stderr)
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
