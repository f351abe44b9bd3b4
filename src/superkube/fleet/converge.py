"""Converge a fleet with the playbooks, through ansible-runner (the project's only caller of it).

A run reports per host: ok, changed, failed, unreachable, skipped, and the task each host is on,
live. Hosts that failed or were unreachable are written to a retry file beside the inventory, so
`superkube converge --retry` (or `--limit @FILE`) picks up exactly those.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

PLAYBOOKS = Path(__file__).resolve().parents[3] / "playbooks"
Settings = Literal["superkube", "stock"]
INVENTORY_ENV = "SUPERKUBE_INVENTORY"
"""The inventory `converge` and `etcd status` use when given no --inventory, named by the operator."""
CURRENT_INVENTORY = Path("/var/lib/superkube/inventory")
"""Else the inventory named in this file: whoever stands a fleet up says here where its inventory is
(`superkube lab up` writes it, `lab down` removes it). The fleet knows no lab; the lab knows this."""


class FleetError(Exception):
    """A user error: one line, what and how to fix."""


def default_inventory(current: Path = CURRENT_INVENTORY) -> Path:
    """--inventory's default: $SUPERKUBE_INVENTORY, else the inventory `current` names."""
    named = os.environ.get(INVENTORY_ENV)
    if named:
        if not Path(named).is_file():
            raise FleetError(f"{INVENTORY_ENV}={named}: no such file; point it at an inventory or unset it")
        return Path(named)
    try:
        path = Path(current.read_text().strip())
    except OSError:
        raise FleetError(
            f"no --inventory given, no {INVENTORY_ENV}, and no fleet is up; pass --inventory FILE "
            "(superkube inventory writes one) or start a lab (superkube lab up)"
        ) from None
    if not path.is_file():
        raise FleetError(f"{current} names {path}, which is gone; pass --inventory FILE or start a lab again")
    return path


def set_current_inventory(path: Path, current: Path = CURRENT_INVENTORY) -> None:
    """Name `path` as the inventory commands use by default (written whole, then renamed into place)."""
    current.parent.mkdir(parents=True, exist_ok=True)
    partial = current.with_name(current.name + ".partial")
    partial.write_text(f"{path.resolve()}\n")
    partial.rename(current)


def clear_current_inventory(path: Path, current: Path = CURRENT_INVENTORY) -> bool:
    """Forget `path` as the default inventory, if it is the one named; True when it was."""
    try:
        named = Path(current.read_text().strip())
    except OSError:
        return False
    if named != path.resolve():
        return False
    current.unlink(missing_ok=True)
    return True


@dataclass
class HostResult:
    host: str
    ok: int = 0
    changed: int = 0
    failed: int = 0
    unreachable: int = 0
    skipped: int = 0
    task: str = ""  # the task the host is on (live), or its last one
    message: str = ""  # the first failure or unreachable message
    changed_tasks: list[str] = field(default_factory=list)  # the tasks that changed something, in order

    @property
    def healthy(self) -> bool:
        return not self.failed and not self.unreachable


@dataclass
class ConvergeResult:
    hosts: dict[str, HostResult]
    seconds: float
    status: str
    retry_file: str | None = None
    playbook: str = ""
    problems: list[str] = field(default_factory=list)

    @property
    def failed_hosts(self) -> list[str]:
        return sorted(h.host for h in self.hosts.values() if not h.healthy)

    @property
    def ok(self) -> bool:
        return self.status == "successful" and not self.failed_hosts and not self.problems

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "status": self.status,
            "seconds": round(self.seconds, 3),
            "playbook": self.playbook,
            "hosts": {name: asdict(h) for name, h in sorted(self.hosts.items())},
            "failed_hosts": self.failed_hosts,
            "retry_file": self.retry_file,
            "problems": self.problems,
        }


def retry_file(inventory: Path) -> Path:
    return inventory.parent / f"{inventory.stem}.retry"


def _message(event_data: dict[str, Any]) -> str:
    res = event_data.get("res") or {}
    text = res.get("msg") or res.get("stderr") or res.get("reason") or ""
    return " ".join(str(text).split())[:300]


def _use_this_environments_ansible() -> None:
    """ansible-runner finds ansible-playbook on PATH; a venv's bin/ need not be on it."""
    here = str(Path(sys.executable).parent)
    if (Path(here) / "ansible-playbook").is_file() and here not in os.environ.get("PATH", "").split(
        os.pathsep
    ):
        os.environ["PATH"] = here + os.pathsep + os.environ.get("PATH", "")
    if shutil.which("ansible-playbook") is None:
        raise FleetError("ansible-playbook not found; install superkube with its dependencies (make install)")


def converge(
    inventory: Path,
    *,
    playbook: str = "site.yml",
    limit: str | None = None,
    tags: str | None = None,
    settings: Settings = "superkube",
    extra_vars: dict[str, Any] | None = None,
    on_update: Callable[[dict[str, HostResult]], None] | None = None,
    forks: int | None = None,
) -> ConvergeResult:
    """Run a playbook over an inventory and summarise it per host."""
    import ansible_runner

    if not inventory.is_file():
        raise FleetError(
            f"--inventory {inventory}: no such file; start a lab (superkube lab up) or write one (superkube inventory)"
        )
    book = PLAYBOOKS / playbook
    if not book.is_file():
        raise FleetError(f"playbook {playbook}: not in {PLAYBOOKS}")
    if limit and limit.startswith("@") and not Path(limit[1:]).is_file():
        raise FleetError(f"--limit {limit}: no such retry file; the last run left nothing to retry")
    hosts: dict[str, HostResult] = {}
    problems: list[str] = []

    def handle(event: dict[str, Any]) -> bool:
        data = event.get("event_data") or {}
        kind = event.get("event", "")
        host = data.get("host")
        if host and kind.startswith("runner_on_"):
            row = hosts.setdefault(host, HostResult(host))
            row.task = data.get("task", row.task)
            if kind == "runner_on_ok":
                row.ok += 1
                if (data.get("res") or {}).get("changed"):
                    row.changed += 1
                    row.changed_tasks.append(data.get("task", ""))
            elif kind == "runner_on_skipped":
                row.skipped += 1
            elif kind == "runner_on_failed" and not data.get("ignore_errors"):
                row.failed += 1
                row.message = row.message or _message(data)
            elif kind == "runner_on_unreachable":
                row.unreachable += 1
                row.message = row.message or _message(data)
        if kind in ("error", "verbose") and "ERROR!" in (event.get("stdout") or ""):
            problems.append(" ".join(event["stdout"].split())[:300])
        if on_update is not None:
            on_update(hosts)
        return True

    _use_this_environments_ansible()
    private = Path(tempfile.mkdtemp(prefix="superkube-runner-"))
    env = _ansible_env(inventory, settings, private)
    if forks:
        env["ANSIBLE_FORKS"] = str(forks)
    started = time.perf_counter()
    try:
        runner = ansible_runner.run(
            private_data_dir=str(private),
            project_dir=str(PLAYBOOKS),
            playbook=str(book),
            inventory=str(inventory.resolve()),
            limit=limit,
            tags=tags,
            extravars=extra_vars or {},
            envvars=env,
            # ansible-runner points the fact cache into each run's own artifacts (deleted below)
            # whatever the environment says; given a path, it keeps the inventory's own, so a later
            # run within fact_caching_timeout does not gather every host's facts again
            fact_cache=env["ANSIBLE_CACHE_PLUGIN_CONNECTION"],
            event_handler=handle,
            quiet=True,
            suppress_env_files=True,
        )
        stats = runner.stats or {}
        if runner.status != "successful" and not stats:
            output = ""
            stdout_file = runner.stdout  # ansible-runner opens the file anew on each access
            if stdout_file:
                with stdout_file:
                    output = stdout_file.read()
            tail = output.strip().splitlines()[-3:]
            problems.append(
                " ".join(" ".join(tail).split())[:400] or f"ansible-playbook ended {runner.status}"
            )
    finally:
        shutil.rmtree(private, ignore_errors=True)
    if stats:  # the final stats are authoritative; the live counts were for the view
        for row in hosts.values():
            row.ok = row.changed = row.failed = row.unreachable = row.skipped = 0
    for key, attr in (
        ("ok", "ok"),
        ("changed", "changed"),
        ("failures", "failed"),
        ("dark", "unreachable"),
        ("skipped", "skipped"),
    ):
        for host, n in (stats.get(key) or {}).items():
            setattr(hosts.setdefault(host, HostResult(host)), attr, n)
    result = ConvergeResult(
        hosts=hosts,
        seconds=time.perf_counter() - started,
        status=runner.status,
        playbook=str(book),
        problems=problems,
    )
    retry = retry_file(inventory)
    if result.failed_hosts:
        retry.write_text("".join(f"{h}\n" for h in result.failed_hosts))
        result.retry_file = str(retry)
    elif retry.exists() and not limit:
        retry.unlink()
    elif retry.exists() and limit and limit == f"@{retry}":
        os.unlink(retry)
    return result


def _ansible_env(inventory: Path, settings: str, private: Path) -> dict[str, str]:
    env = {
        "ANSIBLE_ROLES_PATH": str(PLAYBOOKS / "roles"),
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_HOST_KEY_CHECKING": "True",
    }
    # SSH masters and cached facts belong to this inventory's hosts: a new lab at the same
    # addresses must not reuse a master whose connection went with the old one.
    scope = inventory.resolve().parent / ".ansible" / inventory.stem
    env["ANSIBLE_SSH_CONTROL_PATH_DIR"] = str(scope / "cp")
    env["ANSIBLE_CACHE_PLUGIN_CONNECTION"] = str(scope / "facts")
    if settings == "superkube":
        env["ANSIBLE_CONFIG"] = str(PLAYBOOKS / "ansible.cfg")
        env.update(_mitogen())
    else:  # stock: Ansible's own defaults, with a config file that sets nothing
        stock = private / "stock.cfg"
        stock.write_text("[defaults]\n")
        env["ANSIBLE_CONFIG"] = str(stock)
    return env


def _mitogen() -> dict[str, str]:
    """Mitogen's linear strategy: the play's order and semantics of `linear`, with one Python
    interpreter kept per host over the SSH connection instead of one started for every task, so a
    task costs a message, not a process on each host and a fork here (a converge of the control-plane
    lab: half the time and less than half the CPU). Only `superkube converge` sets it: a plain
    ansible-playbook over playbooks/ansible.cfg runs the built-in linear strategy."""
    import ansible_mitogen

    strategies = Path(ansible_mitogen.__file__).parent / "plugins" / "strategy"
    return {"ANSIBLE_STRATEGY_PLUGINS": str(strategies), "ANSIBLE_STRATEGY": "mitogen_linear"}


# Run on every member: its own status and health, and the member list as it sees it.
ETCD_PROBE = (
    ". /etc/etcd/etcdctl-{cluster}.env; "
    'echo "status=$(etcdctl --command-timeout=5s endpoint status -w json 2>/dev/null)"; '
    'echo "members=$(etcdctl --command-timeout=5s member list -w json 2>/dev/null)"; '
    "etcdctl --command-timeout=5s endpoint health >/dev/null 2>&1 && echo health=true || echo health=false"
)


def etcd_status(inventory: Path) -> dict[str, Any]:
    """Both etcd clusters as their members report them over SSH: members, health, leader, DB size."""
    import ansible_runner

    _use_this_environments_ansible()
    private = Path(tempfile.mkdtemp(prefix="superkube-runner-"))
    seen: dict[str, dict[str, Any]] = {}
    try:
        for cluster in ("main", "events"):
            runner = ansible_runner.run(
                private_data_dir=str(private),
                host_pattern=f"etcd_{cluster}",
                module="ansible.builtin.shell",
                module_args=ETCD_PROBE.format(cluster=cluster),
                inventory=str(inventory.resolve()),
                envvars=_ansible_env(inventory, "superkube", private),
                quiet=True,
                suppress_env_files=True,
            )
            for event in runner.events:
                data = event.get("event_data") or {}
                host = data.get("host")
                if not host or not event.get("event", "").startswith("runner_on_"):
                    continue
                res = data.get("res") or {}
                if event["event"] == "runner_on_ok":
                    seen[host] = {"cluster": cluster, **_parse_probe(res.get("stdout", ""))}
                elif event["event"] in ("runner_on_failed", "runner_on_unreachable"):
                    seen[host] = {"cluster": cluster, "error": _message(data)}
    finally:
        shutil.rmtree(private, ignore_errors=True)
    return _summarise(seen)


def _parse_probe(stdout: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for line in stdout.splitlines():
        key, _, value = line.partition("=")
        if key in ("status", "members"):
            try:
                out[key] = json.loads(value) if value else None
            except ValueError:
                out[key] = None
        elif key == "health":
            out["healthy"] = value == "true"
    return out


def _summarise(seen: dict[str, dict[str, Any]]) -> dict[str, Any]:
    clusters: dict[str, dict[str, Any]] = {}
    for host, probe in sorted(seen.items()):
        name = probe["cluster"]
        cluster = clusters.setdefault(name, {"members": [], "leader": None, "member_count": 0})
        row: dict[str, Any] = {
            "host": host,
            "healthy": bool(probe.get("healthy")),
            "error": probe.get("error"),
        }
        status = (probe.get("status") or [{}])[0] if probe.get("status") else {}
        st = status.get("Status") or {}
        header = st.get("header") or {}
        if st:
            row.update(
                id=f"{header.get('member_id', 0):x}",
                db_size=st.get("dbSize"),
                raft_index=st.get("raftIndex"),
                version=st.get("version"),
                leader=header.get("member_id") == st.get("leader") and st.get("leader") is not None,
                endpoint=status.get("Endpoint"),
            )
            if row["leader"]:
                cluster["leader"] = host
        members = (probe.get("members") or {}).get("members") or []
        cluster["member_count"] = max(cluster["member_count"], len(members))
        cluster["members"].append(row)
    for cluster in clusters.values():
        cluster["healthy"] = sum(m["healthy"] for m in cluster["members"])
        cluster["quorum"] = cluster["healthy"] > cluster["member_count"] // 2
    return {"clusters": clusters}
