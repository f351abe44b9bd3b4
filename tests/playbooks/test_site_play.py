"""site.yml's one play over every host, and what that asks of the roles it gates by group."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

PLAYBOOKS = Path(__file__).resolve().parents[2] / "playbooks"


def _tasks(value: Any) -> Iterator[dict[str, Any]]:
    if isinstance(value, list):
        for item in value:
            yield from _tasks(item)
    elif isinstance(value, dict):
        yield value
        for key in ("block", "rescue", "always"):
            yield from _tasks(value.get(key))


def gated_run_once_tasks(playbooks: Path = PLAYBOOKS) -> list[str]:
    """Tasks that run_once on the play's hosts inside a role site.yml runs only on some groups.

    run_once takes the first host of the play; in a play over every host that host is often not in
    the role's group, so the task is skipped there and, being run once, on every host: a task that
    silently never runs. Such a task must pick its host itself (or run on the controller)."""
    found = []
    for play in yaml.safe_load((playbooks / "site.yml").read_text()):
        # (a role included by a task with a `when` runs only on the hosts that took it: its run_once
        # takes the first of those, so only roles listed under `roles:` can fall into this)
        gated = [r["role"] for r in play.get("roles", []) if isinstance(r, dict) and "when" in r]
        for role in gated:
            for path in sorted((playbooks / "roles" / role / "tasks").glob("*.yml")):
                for task in _tasks(yaml.safe_load(path.read_text())):
                    if task.get("run_once") and task.get("delegate_to") != "localhost":
                        found.append(f"{path.relative_to(playbooks)}: {task.get('name')}")
    return found


def test_no_role_gated_by_group_runs_a_task_once_on_the_plays_first_host() -> None:
    assert gated_run_once_tasks() == []


def test_the_check_finds_the_pitfall(tmp_path: Path) -> None:
    role = tmp_path / "roles" / "r" / "tasks"
    role.mkdir(parents=True)
    (tmp_path / "site.yml").write_text(
        "- hosts: cluster\n  roles:\n    - {role: r, when: \"'g' in group_names\"}\n"
    )
    (role / "main.yml").write_text(
        "- name: Once\n  ansible.builtin.command: 'true'\n  run_once: true\n"
        "- name: On the controller\n  ansible.builtin.command: 'true'\n  run_once: true\n  delegate_to: localhost\n"
    )
    assert gated_run_once_tasks(tmp_path) == ["roles/r/tasks/main.yml: Once"]


def test_the_cluster_play_includes_each_role_with_its_tag() -> None:
    """Each role of the cluster's play is included by a task (gated by its groups, if any) that
    carries the role's tag and applies it to the role's tasks: `converge --tags <role>` runs the
    role whole, its dependencies included, and no host walks through the skipped tasks of a role
    that is not its own."""
    play = yaml.safe_load((PLAYBOOKS / "site.yml").read_text())[0]
    assert "roles" not in play and play["hosts"] == "cluster"
    names = []
    for task in play["tasks"]:
        include = task["ansible.builtin.include_role"]
        names.append(include["name"])
        assert task["tags"] == [include["name"]] == include["apply"]["tags"], task
    assert {p.name for p in (PLAYBOOKS / "roles").iterdir()} - set(names) == {
        "data_disk", "iptables_base", "kube_component", "metrics_store", "monitoring"
    }  # fmt: skip


def test_every_yaml_file_of_the_playbooks_parses() -> None:
    """A task file Ansible cannot read stops every converge before any host is touched, and a role
    only some groups' hosts run is read by no other test: read them all (a value that starts with
    `[` is a YAML list, so a Jinja test beginning with a list literal must be quoted)."""
    broken = []
    for path in sorted(PLAYBOOKS.rglob("*.yml")):
        try:
            yaml.safe_load(path.read_text())
        except yaml.YAMLError as exc:
            broken.append(f"{path.relative_to(PLAYBOOKS)}: {' '.join(str(exc).split())[:200]}")
    assert broken == []
