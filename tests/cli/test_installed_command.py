"""The installed `superkube` imports only what is installed: run from anywhere, no command dies of a
module that only the checkout's root on sys.path would find (pytest puts it there; a user's shell
does not).

Two halves. Read from the source (ast): every import in src/superkube, at module level or inside a
function, names the package itself, the standard library or an installed distribution; the few that
do not are listed below with how they resolve. Run for real: the installed console script, from a
folder outside the checkout with no PYTHONPATH, drives each command that reaches into another tree
of the project (modules/, policies/, playbooks/, the Pulumi program, data/) past its lazy imports.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from importlib.metadata import packages_distributions
from pathlib import Path

import pytest

from superkube.cluster.health import HEALTH_FS_DIR
from superkube.cluster.kube import CPU_NODES
from superkube.lab.agent_pods import DEVICE_PLUGIN
from superkube.lab.faults import DISK_MIB
from superkube.lab.state import LAB_STACK, Host, Lab
from superkube.model.teams import PLAN_WEBHOOK_TLS
from tests.conftest import ROOT

PACKAGE = ROOT / "src" / "superkube"
SUPERKUBE = Path(sys.executable).with_name("superkube")
"""the console script installed beside the interpreter running the tests"""

CHECKOUT_ONLY = {"modules", "policies", "tests", "scripts", "bench", "__main__"}
"""the checkout's own trees: no installation has them on sys.path"""
FROM_THE_PROJECT: dict[str, tuple[set[str], str]] = {
    # module -> (trees, the command that reaches the import, run below): each imports once the
    # project that command found (find_project, or --project) is on sys.path
    "superkube.plan.checks": ({"policies"}, "check"),  # load_rules puts it there first
}
ELSEWHERE: dict[str, set[str]] = {
    "superkube.agents.gpu_burn": {"torch"},  # the GPU tests' image has it; without, one line
    "superkube.agents.remediation": {"scale_governor"},  # on a host, the file beside it
    "superkube.lab.cnirun": {"rates"},  # on a lab host, the file beside it
}
"""imports that resolve where the module runs, not in this environment"""


def module_name(path: Path, root: Path = PACKAGE) -> str:
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(path: Path) -> set[str]:
    """The top-level names `path` imports: `import`, `from x import`, and a module loaded by a
    literal name (`importlib.import_module("x")`, `__import__("x")`); relative imports are the
    package's own."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level:
            names.add(node.module or "")
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            func = node.func
            called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if called in ("import_module", "__import__") and isinstance(node.args[0].value, str):
                names.add(node.args[0].value)
    return {name.split(".")[0] for name in names}


def unresolved(root: Path = PACKAGE) -> dict[str, set[str]]:
    """Module -> the names it imports that are neither superkube, the standard library nor an
    installed distribution's."""
    installed = set(packages_distributions()) | {"superkube"}
    found = {}
    for path in sorted(root.rglob("*.py")):
        names = imported(path) - installed - set(sys.stdlib_module_names)
        if names:
            found[module_name(path, root)] = names
    return found


def test_every_import_of_the_package_resolves_where_it_is_installed() -> None:
    allowed = {**ELSEWHERE, **{m: trees for m, (trees, _) in FROM_THE_PROJECT.items()}}
    found = unresolved()
    wrong = [
        f"{module} imports {sorted(names - allowed.get(module, set()))}: the installed command cannot "
        "import it; name the fact in the package (superkube.cluster) instead"
        for module, names in found.items()
        if names - allowed.get(module, set())
    ]
    assert not wrong, "\n".join(wrong)
    stale = {m: names - found.get(m, set()) for m, names in allowed.items() if names - found.get(m, set())}
    assert stale == {}, "listed here but imported no more: take them off the list"


def test_the_listed_exceptions_never_name_tests_scripts_or_the_program() -> None:
    for trees, _ in FROM_THE_PROJECT.values():
        assert trees <= {"modules", "policies"}
    for names in ELSEWHERE.values():
        assert not names & CHECKOUT_ONLY


def test_the_import_reader_sees_lazy_and_by_name_imports(tmp_path: Path) -> None:
    root = tmp_path / "superkube"
    (root / "lab").mkdir(parents=True)
    (root / "lab" / "fault.py").write_text(
        "import json\n"
        "from . import state\n"
        "from superkube.cluster import health\n"
        "def later():\n"
        "    from modules.platform.node_health import HEALTH_FS_DIR\n"
        "    import tests.conftest\n"
        "    importlib.import_module('policies.rules')\n"
        "    __import__('scripts')\n"
        "    import yaml\n"
    )
    assert unresolved(root) == {"superkube.lab.fault": {"modules", "tests", "policies", "scripts"}}


# --- the installed command, run from outside the checkout ------------------------------------------

NODE = "cpu-1"
ADDRESS = "10.99.0.11"
SSH_STUB = """#!{python}
import json, sys
with open({log!r}, "a") as f:
    f.write(json.dumps(sys.argv[1:]) + "\\n")
"""


def standin_lab(state: Path) -> Lab:
    """A lab's state folder with one CPU node and no hosts behind it: what the lab commands read
    before they reach a host."""
    (state / "pki").mkdir(parents=True)
    (state / "pki" / "admin.kubeconfig").write_text("")
    (state / "pki" / "team-webhook.pem").write_text(PLAN_WEBHOOK_TLS)  # the plan's stand-in
    (state / "imds.json").write_text(json.dumps({NODE: {"compute": {"name": f"vm-{NODE}"}}}))
    lab = Lab(
        hosts=[Host(NODE, CPU_NODES, ADDRESS, 24, "10.99.0.1", pool="cpu")],
        subnets=["10.99.0.0/24"],
        state_dir=str(state),
        base_image="",
        pools={"cpu": {"vm_size": "Standard_D4s_v5"}},
        builds={"kubectl": {"path": str(state / "kubectl")}},
    )
    lab.save()
    return lab


class Outside:
    """The installed command run from a folder outside the checkout, with no PYTHONPATH, its lab
    state in a folder of its own, and an `ssh` that records what it was asked to run."""

    def __init__(self, tmp: Path) -> None:
        self.cwd = tmp / "elsewhere"
        self.cwd.mkdir()
        assert not self.cwd.resolve().is_relative_to(ROOT)
        self.state = tmp / "lab"
        bin_dir = tmp / "bin"
        bin_dir.mkdir()
        self.ssh_log = tmp / "ssh.log"
        stub = bin_dir / "ssh"
        stub.write_text(SSH_STUB.format(python=sys.executable, log=str(self.ssh_log)))
        stub.chmod(0o755)
        keep = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "SUPERKUBE_"))}
        self.env = {**keep, "PATH": f"{bin_dir}{os.pathsep}{keep.get('PATH', '')}"}
        self.env["SUPERKUBE_LAB_STATE"] = str(self.state)

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        assert SUPERKUBE.is_file(), f"{SUPERKUBE}: superkube is not installed beside {sys.executable}"
        proc = subprocess.run(
            [str(SUPERKUBE), *args], capture_output=True, text=True, cwd=self.cwd, env=self.env, timeout=300
        )
        tail = proc.stderr[-3000:]
        assert "Traceback" not in proc.stderr and "ModuleNotFoundError" not in proc.stderr, tail
        return proc

    def ssh_commands(self) -> list[list[str]]:
        text = self.ssh_log.read_text() if self.ssh_log.is_file() else ""
        return [json.loads(line) for line in text.splitlines()]


@pytest.fixture
def outside(tmp_path: Path) -> Outside:
    return Outside(tmp_path)


def last_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""


def test_lab_fault_with_no_lab_up_says_so_in_one_line(outside: Outside) -> None:
    proc = outside.run("lab", "fault", "SOMEHOST", "disk-full")
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip() == "error: no lab is up; run `superkube lab up` and `superkube converge` first"


def test_lab_fault_disk_full_and_clear_run_on_the_node(outside: Outside) -> None:
    standin_lab(outside.state)
    full = outside.run("lab", "fault", NODE, "disk-full")
    assert full.returncode == 0, full.stderr
    assert (
        full.stdout.strip() == f"{NODE}: {HEALTH_FS_DIR} is a {DISK_MIB} MiB filesystem of its own, 99% full"
    )
    (mount,) = outside.ssh_commands()
    assert mount[-2] == f"root@{ADDRESS}"
    assert f"mount -t tmpfs -o size={DISK_MIB}m" in mount[-1] and f"{HEALTH_FS_DIR} &&" in mount[-1]

    cleared = outside.run("lab", "fault", NODE, "clear")
    assert cleared.returncode == 0, cleared.stderr
    assert cleared.stdout.strip() == (
        f"{NODE}: faults cleared (0 scheduled event(s) gone); uncordon it when it reads healthy"
    )
    _, unmount = outside.ssh_commands()
    assert f"umount {HEALTH_FS_DIR}" in unmount[-1]


def test_lab_apply_plans_the_layer_and_reaches_the_lab_s_own_objects(outside: Outside) -> None:
    # the stand-in lab has no node images: the first object only the lab runs its own way stops it,
    # after the plan and the layer's objects were read (FROM_THE_PROJECT)
    standin_lab(outside.state)
    proc = outside.run("lab", "apply")
    assert proc.returncode == 2, proc.stderr
    assert f"planning stack {LAB_STACK}" in proc.stderr
    assert last_line(proc.stderr) == (
        f"error: the lab has no {DEVICE_PLUGIN} image: run `superkube lab down`, then `lab up` again"
    )
    assert outside.ssh_commands() == []


def test_lab_build_reads_the_roles_pins(outside: Outside) -> None:
    proc = outside.run("lab", "build", "--pin", "nosuch=1.0")
    assert proc.returncode == 2, proc.stderr
    assert last_line(proc.stderr).startswith(
        "error: --pin no component named nosuch; the components are etcd,"
    )


def test_check_loads_the_policy_rules_and_runs_the_program(outside: Outside) -> None:
    proc = outside.run("check", "--stack", "dev")
    assert proc.returncode in (0, 1), proc.stderr  # 1: a mandatory violation, the check's own verdict
    assert "rules checked on dev:" in proc.stdout


def test_render_and_monitoring_render_read_the_schemas_and_the_roles(outside: Outside) -> None:
    layer = outside.run("render", "--stack", "dev", "--out", "layer")
    assert layer.returncode == 0, layer.stderr
    assert any((outside.cwd / "layer").iterdir())
    monitoring = outside.run("monitoring", "render", "--stack", "dev", "--out", "monitoring")
    assert monitoring.returncode == 0, monitoring.stderr
    assert any((outside.cwd / "monitoring").iterdir())


def test_converge_finds_the_playbooks(outside: Outside) -> None:
    (outside.cwd / "empty.yml").write_text("all:\n  hosts: {}\n")
    proc = outside.run("converge", "--inventory", "empty.yml", "--output", "json")
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["ok"] and result["playbook"] == str(ROOT / "playbooks" / "site.yml")


def test_inventory_reads_the_stack(outside: Outside) -> None:
    proc = outside.run("inventory", "--stack", "dev")
    assert proc.returncode == 0, proc.stderr
    assert "plugin: azure.azcollection.azure_rm" in proc.stdout


IP_STUB = """#!{python}
import json, sys
print(json.dumps(sys.argv[1:]))
print(sys.stdin.read(), end="")
"""


def test_lab_kubectl_hands_every_argument_and_its_input_to_the_lab_s_kubectl(outside: Outside) -> None:
    """What `superkube lab kubectl` runs: the lab's kubectl as its admin, in the switch namespace
    (here `ip` is a stand-in that prints what it was asked to run, and its input)."""
    from superkube.lab.layer import SWITCH

    standin_lab(outside.state)
    stub = Path(outside.env["PATH"].split(os.pathsep)[0]) / "ip"
    stub.write_text(IP_STUB.format(python=sys.executable))
    stub.chmod(0o755)
    args = ["-n", "research", "apply", "--server-side", "-f", "-", "-o", "name", "--help"]
    assert SUPERKUBE.is_file()
    proc = subprocess.run([str(SUPERKUBE), "lab", "kubectl", *args], input="kind: Namespace\n",
                          capture_output=True, text=True, cwd=outside.cwd, env=outside.env, timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    argv, rest = proc.stdout.split("\n", 1)
    kubeconfig = str(outside.state / "pki" / "admin.kubeconfig")
    assert json.loads(argv) == [
        "netns",
        "exec",
        SWITCH,
        str(outside.state / "kubectl"),
        "--kubeconfig",
        kubeconfig,
        *args,
    ]
    assert rest == "kind: Namespace\n"
