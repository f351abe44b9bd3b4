"""Jinja filter: Grafana's dashboards and provisioning files for one cluster, written by
superkube.cluster.dashboards (the same code `superkube monitoring render` uses), as
{path under grafana/: content}; the monitoring role copies each to the same path under
superkube.cluster.dashboards.GRAFANA_DIR.

    {{ cluster | superkube_grafana_files(store_query_url) }}
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any


def grafana_files(cluster: str, store_query_url: str) -> dict[str, str]:
    from superkube.cluster import dashboards  # the controller runs Ansible from the project's environment

    with tempfile.TemporaryDirectory() as tmp:
        # plain str: Ansible hands over its own string types
        written = dashboards.write(Path(tmp), str(cluster), str(store_query_url))
        root = Path(tmp) / "grafana"
        return {str(path.relative_to(root)): path.read_text() for path in written.paths}


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"superkube_grafana_files": grafana_files}
