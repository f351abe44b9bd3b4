"""The agents as the images run them: the project's wheel installed into a fresh virtualenv outside
the checkout, every agent's entry point started from there. The data files the agents read (VM
sizes, GPU health thresholds) must come with the wheel: an agent that found them only in a checkout
would fail on every node. The round-trips go to the real API server."""

from __future__ import annotations

import json
import subprocess
import sys
import sysconfig
from pathlib import Path
from typing import Any

import pytest

from superkube.harness.apiserver import LocalApi
from tests.agents.conftest import make_node, unique
from tests.conftest import ROOT

READINGS = Path(__file__).parent / "readings"
# the programs the node roles start on hosts (units, not pods); the in-cluster layer's are read from it
HOST_PROGRAMS = ("iptables_exporter", "cni_config")
# CNI plugins: asked by the runtime (CNI_COMMAND), not by options
PLUGINS = ("cni_bandwidth", "cni_accounting")


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh virtualenv with the wheel built from this checkout. Its dependencies come from the
    test environment's site-packages through a path file (no index is asked), and the checkout's
    own editable install is not among them."""
    d = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(d / "dist"), str(ROOT)], check=True, capture_output=True, timeout=300)  # fmt: skip
    (wheel,) = (d / "dist").glob("superkube-*.whl")
    env = d / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True, timeout=120)
    site = next((env / "lib").glob("python3*/site-packages"))
    (site / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "-q",
                    "--target", str(site), str(wheel)], check=True, capture_output=True, timeout=300)  # fmt: skip
    return env / "bin" / "python"


def run(python: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(python), *args], cwd=cwd, capture_output=True, text=True, timeout=120)


def layer_programs(plan: Any) -> set[str]:
    """Every `python -m superkube.agents.<name>` a container of the plan's in-cluster layer runs."""
    from superkube.plan import layer

    found: set[str] = set()

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            command = node.get("command")
            if isinstance(command, list) and "-m" in command[:-1]:
                module = command[command.index("-m") + 1]
                if module.startswith("superkube.agents."):
                    found.add(module.removeprefix("superkube.agents."))
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(layer.objects(plan))
    return found


def test_the_wheel_carries_the_agents_and_their_data(venv: Path, tmp_path: Path, flagship_plan: Any) -> None:
    where = run(venv, tmp_path, "-c", "import superkube, superkube.model.vmsizes as v; print(v.__file__); "
                "print(len(v._load()[0]))")  # fmt: skip
    assert where.returncode == 0, where.stderr
    installed, count = where.stdout.split()
    assert str(venv.parents[1]) in installed and str(ROOT) not in installed  # not the checkout's copy
    assert int(count) > 0
    programs = layer_programs(flagship_plan)
    assert {
        "node_health",
        "preflight",
        "gpu_test",
        "health_controller",
        "team_taints",
        "team_webhook",
    } <= programs
    for name in sorted(programs | set(HOST_PROGRAMS)):
        done = run(venv, tmp_path, "-m", f"superkube.agents.{name}", "--help")
        assert done.returncode == 0 and "usage:" in done.stdout, (name, done.stderr)
    for name in PLUGINS:
        done = subprocess.run([str(venv), "-m", f"superkube.agents.{name}"], cwd=tmp_path, input='{"cniVersion": "1.0.0"}',
                              env={"CNI_COMMAND": "VERSION"}, capture_output=True, text=True, timeout=60)  # fmt: skip
        assert done.returncode == 0 and "supportedVersions" in done.stdout, (name, done.stdout, done.stderr)


def test_preflight_from_the_wheel_passes_a_healthy_node(venv: Path, api: LocalApi, tmp_path: Path) -> None:
    """The round that used to find no VM sizes outside the checkout: read the node, judge the reading
    (GPU count for the VM size, thresholds), lift the taint through the real API server."""
    from superkube.model.spec import PREFLIGHT_TAINT_KEY

    node = unique("wheel")
    make_node(api, node, {PREFLIGHT_TAINT_KEY: "pending"},
              [{"key": PREFLIGHT_TAINT_KEY, "value": "pending", "effect": "NoSchedule"}])  # fmt: skip
    reading = tmp_path / "reading.json"
    reading.write_text(json.dumps({**json.loads((READINGS / "healthy.json").read_text()), "node": node}))
    done = run(venv, tmp_path, "-m", "superkube.agents.preflight", "--node", node, "--reading", str(reading),
               "--kubeconfig", str(api.kubeconfig), "--metrics-port", "0", "--metrics-address", "127.0.0.1",
               "--interval", "0.1", "--rounds", "2")  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "preflight passed" in done.stderr and "Traceback" not in done.stderr
    from tests.agents.conftest import admin

    assert not admin(api).read_node(node).spec.taints
    health = run(venv, tmp_path, "-m", "superkube.agents.node_health", "--node", node, "--pool", "p",
                 "--reading", str(reading), "--kubeconfig", str(api.kubeconfig), "--metrics-port", "0",
                 "--metrics-address", "127.0.0.1", "--interval", "0.1", "--rounds", "1")  # fmt: skip
    assert health.returncode == 0 and "Traceback" not in health.stderr, health.stderr
