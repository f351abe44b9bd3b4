"""Jinja filter: one Prometheus shard's configuration, built by superkube.cluster.monitoring (the same code
`superkube monitoring render` uses), from the inventory's hosts by group.

    {{ groups | superkube_prometheus_config(hostvars, target_groups, cluster, shards, shard, store_url, ...) }}
"""

from __future__ import annotations

from typing import Any


def prometheus_config(
    groups: dict[str, list[str]],
    hostvars: Any,
    target_groups: list[str],
    cluster: str,
    shards: int,
    shard: int,
    store_url: str,
    nodes_from_kubernetes: bool = True,
    api_server: str = "",
    rule_files: list[str] | None = None,
    scrape_interval: str = "30s",
    only_jobs: list[str] | None = None,
    ports: dict[str, list[int]] | None = None,
    autoscaler: bool = True,
    more_targets: dict[str, list[str]] | None = None,
    skip_jobs: list[str] | None = None,
) -> str:
    from superkube.cluster import monitoring  # the controller runs Ansible from the project's environment

    targets = {g: [str(hostvars[h]["ansible_host"]) for h in groups.get(g, [])] for g in target_groups}
    for group, hosts in (more_targets or {}).items():
        targets[str(group)] = [*targets.get(str(group), []), *(str(h) for h in hosts)]
    jobs = [str(j) for j in only_jobs] if only_jobs else [j.name for j in monitoring.jobs()]
    skipped = {str(j) for j in skip_jobs or []}

    # plain str: Ansible hands over its own string types, which the YAML dumper refuses
    config = monitoring.prometheus_config(
        str(cluster),
        int(shards),
        int(shard),
        str(store_url),
        targets,
        nodes_from_kubernetes=bool(nodes_from_kubernetes),
        api_server=str(api_server),
        rule_files=[str(f) for f in rule_files or []],
        scrape_interval=str(scrape_interval),
        only_jobs=[j for j in jobs if j not in skipped],
        ports={str(j): [int(p) for p in on] for j, on in (ports or {}).items()},
        autoscaler=bool(autoscaler),
    )
    return monitoring.render(config)


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"superkube_prometheus_config": prometheus_config}
