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
) -> str:
    from superkube.cluster import monitoring  # the controller runs Ansible from the project's environment

    targets = {g: [str(hostvars[h]["ansible_host"]) for h in groups.get(g, [])] for g in target_groups}

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
        only_jobs=[str(j) for j in only_jobs] if only_jobs else None,
    )
    return monitoring.render(config)


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"superkube_prometheus_config": prometheus_config}
