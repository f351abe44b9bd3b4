"""Runs inside the benchmark's node namespace, as a container runtime would: ADD `count` pods through
the node's conflist one after another, then DEL them in the order they came, timing every plugin of
every call. Reads its job as JSON on stdin ({"bin", "network", "count"}), prints JSON. Standard
library only; makes and removes a namespace per pod."""

import json
import os
import subprocess
import sys
import time
import uuid

job = json.load(sys.stdin)
network, count = job["network"], int(job["count"])


def call(
    command: str, plugin: dict, container: str, netns: str, prev: object, args: str
) -> tuple[object, float]:
    conf = {**plugin, "name": network["name"], "cniVersion": network["cniVersion"]}
    if prev is not None:
        conf["prevResult"] = prev
    env = {**os.environ, "CNI_COMMAND": command, "CNI_CONTAINERID": container, "CNI_NETNS": f"/run/netns/{netns}",
           "CNI_IFNAME": "eth0", "CNI_PATH": job["bin"], "CNI_ARGS": args}  # fmt: skip
    started = time.perf_counter()
    proc = subprocess.run([os.path.join(job["bin"], plugin["type"])], input=json.dumps(conf).encode(),
                          capture_output=True, env=env, check=False)  # fmt: skip
    took = time.perf_counter() - started
    if proc.returncode != 0:
        raise SystemExit(f"{command} {plugin['type']}: {proc.stdout.decode()} {proc.stderr.decode()}")
    return (json.loads(proc.stdout) if proc.stdout.strip() else None), took


pods = []
add: dict[str, list[float]] = {p["type"]: [] for p in network["plugins"]}
add["chain"] = []
for i in range(count):
    container, netns = uuid.uuid4().hex * 2, f"skpa-b-{uuid.uuid4().hex[:8]}"
    subprocess.run(["ip", "netns", "add", netns], check=True)
    args = f"IgnoreUnknown=1;K8S_POD_NAMESPACE=bench;K8S_POD_NAME=worker-{i};K8S_POD_INFRA_CONTAINER_ID={container}"
    prev, total = None, 0.0
    for plugin in network["plugins"]:
        prev, took = call("ADD", plugin, container, netns, prev, args)
        add[plugin["type"]].append(took)
        total += took
    add["chain"].append(total)
    pods.append((container, netns, prev))
delete: dict[str, list[float]] = {p["type"]: [] for p in network["plugins"]}
delete["chain"] = []
for container, netns, prev in pods:
    total = 0.0
    for plugin in reversed(network["plugins"]):
        _, took = call("DEL", plugin, container, netns, prev, "")
        delete[plugin["type"]].append(took)
        total += took
    delete["chain"].append(total)
    subprocess.run(["ip", "netns", "del", netns], check=True)
print(json.dumps({"add_s": add, "del_s": delete}))
