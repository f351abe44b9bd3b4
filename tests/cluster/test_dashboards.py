"""Grafana's dashboards for a cluster (superkube.cluster.dashboards): Grafana's own schema in
grafana-foundation-sdk reads back every dashboard as it was written, promtool parses every query,
every metric a query names is one an agent of ours exports, a recording rule records or a pinned
upstream version exports, and `superkube monitoring render` writes them with Grafana's provisioning.

That every panel returns data from the lab's real store (or is in LAB_EMPTY) needs a running lab with
a monitoring host: tests/lab/test_seeing_the_cluster.py and tests/lab/test_monitoring.py; these tests
need none.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import json
import pkgutil
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

import superkube.agents
from superkube.agents import iptables_exporter
from superkube.cli import app
from superkube.cluster import dashboards, monitoring
from superkube.cluster.autoscaling import VERSION as AUTOSCALER_VERSION
from superkube.cluster.kube import metrics_store_query_url
from superkube.plan import engine as planning
from tests.conftest import ROOT

PROMTOOL = monitoring.ROOT / ".tools" / "bin" / "promtool"


def _family_names(registry: Any) -> set[str]:
    """The sample names a prometheus_client registry exports, from its families' types (a labelled
    family exports no sample until a label set is used, so its samples alone would miss it)."""
    suffixes = {"counter": ("_total",), "gauge": ("",), "histogram": ("_bucket", "_count", "_sum"),
                "summary": ("", "_count", "_sum"), "info": ("_info",)}  # fmt: skip
    return {f"{family.name}{s}" for family in registry.collect() for s in suffixes[family.type]}


def exported_by_agents() -> set[str]:
    """Every metric name superkube's agents export: each agent module's Metrics registry, and the
    iptables exporter's own (its rule counters are exposition text it writes itself)."""
    names: set[str] = set()
    for info in pkgutil.iter_modules(superkube.agents.__path__):
        if info.name == "__main__":
            continue
        module = importlib.import_module(f"superkube.agents.{info.name}")
        metrics = getattr(module, "Metrics", None)
        if isinstance(metrics, type) and metrics.__module__ == module.__name__:
            names |= _family_names(metrics().registry)
    names |= _family_names(iptables_exporter.Exporter([]).registry)
    names |= {
        line.split()[2]
        for text in iptables_exporter.HELP
        for line in text.splitlines()
        if line.startswith("# TYPE")
    }
    return names


def recorded() -> set[str]:
    groups = yaml.safe_load(monitoring.RULES.read_text())["groups"]
    return {rule["record"] for group in groups for rule in group["rules"] if "record" in rule}


OURS = exported_by_agents()
KNOWN = OURS | recorded() | set(dashboards.UPSTREAM)


def unknown(expr: str) -> set[str]:
    """The metrics a query names that nothing of ours exports, no rule records and UPSTREAM lacks."""
    return dashboards.metrics_of(expr) - KNOWN


def used() -> set[str]:
    return {m for _, _, query in dashboards.queries() for m in dashboards.metrics_of(query.expr)}


def variable_queries() -> dict[str, str]:
    """Each variable's PromQL: the series selector inside Grafana's label_values(...)."""
    out = {}
    for name, (_, query, _) in dashboards.VARIABLE_QUERIES.items():
        inner = re.fullmatch(r"label_values\((.*), (\w+)\)", query)
        assert inner, query
        out[name] = inner[1]
    return out


@pytest.fixture(scope="module")
def rendered() -> dict[str, dict[str, Any]]:
    return {board.uid: dashboards.dashboard(board) for board in dashboards.boards()}


# --- Grafana's schema ----------------------------------------------------------------------------


def test_every_dashboard_reads_back_through_the_sdks_schema(rendered: dict[str, dict[str, Any]]) -> None:
    from grafana_foundation_sdk.cog.encoder import JSONEncoder
    from grafana_foundation_sdk.cog.plugins import register_default_plugins
    from grafana_foundation_sdk.models import prometheus, timeseries
    from grafana_foundation_sdk.models.dashboard import Dashboard, Panel

    register_default_plugins()  # the panel and query types' own schemas, for from_json
    boards = {board.uid: board for board in dashboards.boards()}
    for uid, doc in rendered.items():
        model = Dashboard.from_json(doc)
        again = json.loads(JSONEncoder(sort_keys=True).encode(model))
        assert again == doc, f"{uid}: Grafana's schema does not read back what was written"
        panels = [p for p in model.panels or [] if isinstance(p, Panel)]
        assert len(panels) == sum(1 for _ in boards[uid].panels())
        for p in panels:
            assert p.type_val == "timeseries" and isinstance(p.options, timeseries.Options), p.title
            assert isinstance(p.field_config.defaults.custom, timeseries.FieldConfig), p.title
            assert p.targets and all(isinstance(t, prometheus.Dataquery) for t in p.targets), p.title
            assert all(t.datasource.uid == dashboards.DATASOURCE_UID for t in p.targets), p.title


def test_dashboards_and_panels_are_named_once(rendered: dict[str, dict[str, Any]]) -> None:
    boards = dashboards.boards()
    assert len({b.uid for b in boards}) == len({b.title for b in boards}) == len(boards) == 8
    for board in boards:
        titles = [p.title for p in board.panels()]
        assert len(titles) == len(set(titles)), board.uid
        ids = [p["id"] for p in rendered[board.uid]["panels"]]
        assert len(ids) == len(set(ids)), board.uid


# --- the queries ---------------------------------------------------------------------------------


def promtool_parses(exprs: list[str], tmp: Path) -> list[str]:
    """promtool's verdict on each query: "" when it parses, else its error. promtool has no offline
    query checker, so each query goes in a rules file of its own as a recording rule's expression,
    which `promtool check rules` parses with Prometheus' own parser."""
    files = []
    for i, expr in enumerate(exprs):
        path = tmp / f"query-{i:03d}.yml"
        rules = {"groups": [{"name": "dashboard", "rules": [{"record": "dashboard:query", "expr": expr}]}]}
        path.write_text(yaml.safe_dump(rules, sort_keys=False))
        files.append(path)
    assert PROMTOOL.is_file(), f"{PROMTOOL} is missing: run `bash scripts/debian-deps.sh` (make test does)"
    proc = subprocess.run(
        [str(PROMTOOL), "check", "rules", *map(str, files)], capture_output=True, text=True, timeout=120
    )
    report = proc.stdout + proc.stderr
    verdicts = []
    for path in files:  # stdout says which file passed; stderr says why one did not
        passed = "SUCCESS: 1 rules found" in proc.stdout.split(f"Checking {path}\n")[1].split("Checking ")[0]
        why = [line for line in proc.stderr.splitlines() if line.startswith(f"{path}:")]
        verdicts.append("" if passed else "\n".join(why) or f"FAILED, without a reason:\n{report}")
    assert (proc.returncode == 0) == all(v == "" for v in verdicts), report
    return verdicts


def test_every_query_parses_with_promtool(tmp_path: Path) -> None:
    found = [
        (board.uid, p.title, dashboards.concrete(query.expr)) for board, p, query in dashboards.queries()
    ]
    found += [("variables", name, dashboards.concrete(expr)) for name, expr in variable_queries().items()]
    verdicts = promtool_parses([expr for _, _, expr in found], tmp_path)
    failed = [
        f"{uid} / {title}: {expr}\n  {v}" for (uid, title, expr), v in zip(found, verdicts, strict=True) if v
    ]
    assert not failed, "\n".join(failed)
    assert len(found) > 100


def test_promtool_refuses_a_query_that_does_not_parse(tmp_path: Path) -> None:
    good = 'sum by (job) (rate(up{cluster=~".+"}[5m]))'
    verdicts = promtool_parses([good, good.removesuffix(")"), "sum by (job) rate(up[5m])"], tmp_path)
    assert verdicts[0] == "", verdicts
    assert "unclosed left parenthesis" in verdicts[1] and 'unexpected identifier "rate"' in verdicts[2], (
        verdicts
    )


def test_the_selectors_a_query_names_are_read_as_promql_reads_them() -> None:
    expr = (
        'topk(10, sum by (namespace, pod) (rate(iptables_rule_bytes_total{cluster=~"$cluster", pod!="a{b}"}'
        "[$__rate_interval]))) * 8 / on (instance) group_left (pool) max by (instance, pool) (up offset 5m)"
        ' or vector(0) - time() + histogram_quantile(0.99, sum without (code) (rate(x_bucket{le!="1"}[1h])))'
        " and count(job:apiserver_request:rate5m) > bool 1e9"
    )
    assert dashboards.metrics_of(expr) == {
        "iptables_rule_bytes_total", "up", "x_bucket", "job:apiserver_request:rate5m",
    }  # fmt: skip
    (first, *_) = dashboards.selectors(expr)
    assert first.matchers == 'cluster=~"$cluster",pod!="a{b}"'
    assert dashboards.concrete(expr).count('cluster=~".+"') == 1


def test_every_metric_is_ours_recorded_or_a_pinned_upstream_one() -> None:
    assert {
        "superkube_health_actions_total",
        "superkube_gpu_reset_total",
        "iptables_rule_bytes_total",
    } <= OURS
    named = {
        f"{board.uid} / {p.title}": sorted(unknown(query.expr))
        for board, p, query in dashboards.queries()
        if unknown(query.expr)
    }
    named |= {f"variable {n}": sorted(unknown(e)) for n, e in variable_queries().items() if unknown(e)}
    assert not named, f"queries name metrics nothing exports: {named}"
    # every upstream entry is read by a panel, and none stands in for one of ours or a rule's
    assert set(dashboards.UPSTREAM) <= used()
    assert not set(dashboards.UPSTREAM) & (OURS | recorded())


def test_a_query_naming_a_metric_nothing_exports_fails() -> None:
    typo = 'sum by (pool) (superkube_health_cordoned_node{cluster=~"$cluster"})'  # the s is missing
    made_up = 'rate(superkube_made_up_total{cluster=~"$cluster"}[5m]) / on () up'
    assert unknown(typo) == {"superkube_health_cordoned_node"}
    assert unknown(made_up) == {"superkube_made_up_total"}
    assert unknown(typo.replace("_node{", "_nodes{")) == set()


def test_every_selector_reads_one_cluster_of_the_store() -> None:
    loose = [
        f"{board.uid} / {p.title}: {s}"
        for board, p, query in dashboards.queries()
        for s in dashboards.selectors(query.expr)
        if dashboards.C not in s.matchers
    ]
    assert not loose, "\n".join(loose)


def test_job_matchers_name_the_generated_scrape_jobs() -> None:
    jobs = {job.name for job in monitoring.jobs()}
    named = set()
    for _, _, query in dashboards.queries():
        for value in re.findall(r'\bjob=~?"([^"]*)"', query.expr):
            named |= set(value.split("|"))
    assert named and named <= jobs, named - jobs


# --- what cannot show data, and why --------------------------------------------------------------


def scraped(metric: str) -> bool:
    """Whether a job of the generated Prometheus configuration reads the metric."""
    jobs = {job.name for job in monitoring.jobs()} | {dashboards.EVERY_JOB}
    if metric in recorded():
        return True  # the shards record it from what they scrape
    if metric in dashboards.UPSTREAM:
        named = dashboards.UPSTREAM[metric].jobs
    else:
        (prefix,) = [p for p in dashboards.SCRAPED_BY if metric.startswith(p)]
        named = (dashboards.SCRAPED_BY[prefix],) if dashboards.SCRAPED_BY[prefix] else ()
    assert set(named) <= jobs, f"{metric}: {named} are not scrape jobs"
    return bool(named)


def test_not_scraped_lists_exactly_the_metrics_no_job_reads() -> None:
    assert {m for m in used() if not scraped(m)} == set(dashboards.NOT_SCRAPED)
    for metric in OURS:  # every agent's metric has its scrape job said, a new agent's too
        assert len([p for p in dashboards.SCRAPED_BY if metric.startswith(p)]) == 1, metric
    for metric in (*dashboards.UPSTREAM, *OURS):
        scraped(metric)  # every job named is one the configuration has
    # the GPU reset's pods have no metrics port: pod discovery keeps only ports of that name
    rendered = monitoring.prometheus_config("c", 1, 0, "http://store/api/v1/write", {})
    (agents,) = [j for j in rendered["scrape_configs"] if j["job_name"] == "node-agents"]
    assert {"source_labels": ["__meta_kubernetes_pod_container_port_name"], "regex": "metrics",
            "action": "keep"} in agents["relabel_configs"]  # fmt: skip


def test_lab_empty_and_not_scraped_name_panels_that_exist_and_say_so(
    rendered: dict[str, dict[str, Any]],
) -> None:
    panels = {dashboards.key(board, p): (board, p) for board in dashboards.boards() for p in board.panels()}
    assert set(dashboards.LAB_EMPTY) <= set(panels), set(dashboards.LAB_EMPTY) - set(panels)
    assert set(dashboards.NOT_SCRAPED) <= used()
    described = {
        f"{uid}/{p['title']}": p.get("description", "")
        for uid, doc in rendered.items()
        for p in doc["panels"]
    }
    for name, reason in dashboards.LAB_EMPTY.items():
        assert f"Empty on the lab: {reason}." in described[name], name
    for name, (_, p) in panels.items():
        for metric, reason in dashboards.not_scraped_in(p).items():
            assert metric in described[name] and reason in described[name], name
        if name not in dashboards.LAB_EMPTY:
            assert "Empty on the lab" not in described[name], name
    # the two reasons the lab has no data for a panel: a GPU's (the reset) and the autoscaler's
    assert {r for r in dashboards.LAB_EMPTY.values()} >= {
        dashboards.GPU_RESET_ONLY,
        dashboards.AUTOSCALER_ONLY,
    }


# --- the versions named are the pinned ones ------------------------------------------------------


def test_upstream_versions_are_the_pinned_ones() -> None:
    release = yaml.safe_load((ROOT / "playbooks/roles/kube_component/vars/release-1.35.yml").read_text())
    assert release["kube_component_release"]["version"] == dashboards.KUBERNETES_VERSION
    assert release["kube_component_release"]["etcd"]["version"] == dashboards.ETCD_VERSION
    store = yaml.safe_load((ROOT / "playbooks/roles/metrics_store/defaults/main.yml").read_text())
    assert store["metrics_store_version"] == dashboards.VICTORIA_METRICS_VERSION
    assert dashboards.UPSTREAM["cluster_autoscaler_nodes_count"].version == AUTOSCALER_VERSION
    monitoring = yaml.safe_load((ROOT / "playbooks/roles/monitoring/defaults/main.yml").read_text())
    assert monitoring["monitoring_prometheus_version"] == dashboards.PROMETHEUS_VERSION


def test_the_grafana_the_role_pins_is_the_one_the_sdk_targets() -> None:
    sdk = importlib.metadata.version("grafana-foundation-sdk")  # "<epoch>!<Grafana version>"
    pinned = yaml.safe_load((ROOT / "playbooks/roles/monitoring/defaults/main.yml").read_text())
    grafana = pinned["monitoring_grafana_version"]
    assert "!" in sdk and sdk.split("!")[1].split(".")[:2] == grafana.split(".")[:2], (sdk, grafana)
    assert pinned["monitoring_grafana_url"].endswith(
        "/grafana-{{ monitoring_grafana_version }}.linux-{{ monitoring_grafana_arch }}.tar.gz"
    )
    # checked against the sha256 Grafana publishes beside the tarball
    assert pinned["monitoring_grafana_checksum"] == "sha256:{{ monitoring_grafana_url }}.sha256"
    specs = yaml.safe_load((ROOT / "playbooks/roles/monitoring/meta/argument_specs.yml").read_text())
    options = specs["argument_specs"]["main"]["options"]
    assert options["monitoring_grafana_version"]["default"] == grafana
    assert pinned["monitoring_grafana_dir"] == dashboards.GRAFANA_DIR


# --- superkube monitoring render ----------------------------------------------------------------


def test_monitoring_render_writes_the_dashboards_and_grafanas_provisioning(tmp_path: Path) -> None:
    out = tmp_path / "monitoring"
    result = CliRunner().invoke(app, ["monitoring", "render", "--stack", "dev", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "8 Grafana dashboards" in result.output
    grafana = out / "grafana"
    written = sorted(p.name for p in (grafana / "dashboards").iterdir())
    assert written == sorted(f"{b.uid}.json" for b in dashboards.boards())
    for board in dashboards.boards():
        doc = json.loads((grafana / "dashboards" / f"{board.uid}.json").read_text())
        assert doc == dashboards.dashboard(board)
    (providers,) = yaml.safe_load((grafana / "provisioning/dashboards/superkube.yml").read_text())[
        "providers"
    ]
    assert providers["type"] == "file" and providers["options"]["path"] == dashboards.DASHBOARDS_DIR
    (source,) = yaml.safe_load((grafana / "provisioning/datasources/superkube.yml").read_text())[
        "datasources"
    ]
    _, spec, addresses = planning.load(ROOT, "dev")
    assert source["uid"] == dashboards.DATASOURCE_UID and source["type"] == "prometheus"
    assert source["url"] == metrics_store_query_url(spec, addresses)
    assert source["url"].endswith(":8481/select/0/prometheus")
    assert source["jsonData"]["timeInterval"] == monitoring.SCRAPE_INTERVAL
    assert (out / "prometheus-0.yml").is_file() and (out / "rules" / "superkube.yml").is_file()


def test_monitoring_render_without_out_prints_every_file() -> None:
    result = CliRunner().invoke(app, ["monitoring", "render", "--stack", "dev"])
    assert result.exit_code == 0, result.output
    files = re.findall(r"^# file: (\S+)$", result.stdout, re.M)
    assert "grafana/dashboards/superkube-network.json" in files
    assert "grafana/provisioning/datasources/superkube.yml" in files
    assert "prometheus-0.yml" in files
