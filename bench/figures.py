"""The guides' figures, made from bench/results/ and the code, so they cannot drift from either.

Run: .venv/bin/python bench/figures.py           (prints the blocks)
     .venv/bin/python bench/figures.py --write   (rewrites each between its figure markers, in the one
                                                  page of README.md and docs/*.md that holds them:
                                                  today docs/09-figures.md)
tests/test_readme.py fails when a block is not what this prints, when the monitoring guide's sizing
sentence says other figures than `sizing_phrases`, and when a results file was measured on a tree
that has changed since (another rule count, object count or resource count).
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "src")]

RESULTS = ROOT / "bench" / "results"

from bench.ci_time import ALLOWANCE_MIN, TARGET_MIN  # noqa: E402  (the suite's budget, one place)

SCRAPE_INTERVAL_S = 30
SERIES_ALLOWANCE = (
    4  # kubelets, cAdvisor and 96-CPU hosts the lab cannot show: four times the measured series
)
GB = 10**9


def results(name: str) -> dict[str, Any]:
    return json.loads((RESULTS / f"{name}.json").read_text())


def _days(text: str) -> int:
    """VictoriaMetrics' -retentionPeriod (90d, 1y, 6m...) in days."""
    number, unit = int(text[:-1]), text[-1]
    return number * {"d": 1, "w": 7, "m": 31, "y": 365}[unit]


def store_sizing() -> dict[str, float]:
    """How long the flagship's metrics store holds its samples, from the measured series and bytes."""
    from superkube.plan import engine as planning

    _, spec, addresses = planning.load(ROOT, "flagship")
    monitoring = results("monitoring")
    per_host = sum(v["after"] for k, v in monitoring["series_per_host"].items() if "exporter" in k)
    series = addresses.capacity["nodes"] * per_host
    gb_per_day = (
        series / SCRAPE_INTERVAL_S * 86_400 * monitoring["store"]["victoriametrics_bytes_per_sample"] / GB
    )
    role = yaml.safe_load((ROOT / "playbooks/roles/metrics_store/defaults/main.yml").read_text())
    raw_gb = spec.metrics_store_count * spec.metrics_store_disk_gb * 2**30 / GB
    usable_gb = raw_gb / role["metrics_store_replication_factor"]
    return {
        "nodes": addresses.capacity["nodes"],
        "series_per_node": per_host,
        "series_m": series / 1e6,
        "samples_per_s": series / SCRAPE_INTERVAL_S,
        "gb_per_day": gb_per_day,
        "hosts": spec.metrics_store_count,
        "disk_gib": spec.metrics_store_disk_gb,
        "replication": role["metrics_store_replication_factor"],
        "days_measured": usable_gb / gb_per_day,
        "days_allowance": usable_gb / (gb_per_day * SERIES_ALLOWANCE),
        "retention_days": _days(role["metrics_store_retention"]),
    }


def rule_count() -> int:
    from policies.rules import ALL_RULES

    return len(ALL_RULES)


def summary_table() -> str:
    plan, check, rendered = results("plan"), results("check"), results("render")
    storm = results("join_storm")
    flagship = next(v for k, v in storm["scenarios"].items() if k.startswith("stack "))
    upstream = next(v for k, v in storm["scenarios"].items() if k.startswith("upstream"))
    hook = results("team_webhook")
    built = results("build")
    store = store_sizing()
    met = "met" if check["check_adds_s"] < 1 else "missed"
    rows = [
        ("rules `superkube check` evaluates", f"{rule_count()}", "policies/rules"),
        (
            "the flagship's `superkube plan` as a whole process (median); over a bare import of the SDKs",
            f"{plan['flagship_cold_cli_s_median']:.2f} s (target < 2 s{_missed(plan['flagship_cold_cli_s_median'], 2)}); "
            f"{plan['flagship_cli_over_sdk_import']:.1f}x (target 3x{_missed(plan['flagship_cli_over_sdk_import'], 3)})",
            "plan.json",
        ),
        (
            "`superkube --help` (median)",
            f"{plan['help_s_median']:.2f} s (target < 0.5 s{_missed(plan['help_s_median'], 0.5)})",
            "plan.json",
        ),
        (
            "resources in the flagship's plan",
            f"{plan['rows'][-1]['resources']:,} ({plan['rows'][0]['resources']:,} at 75 GPU nodes)",
            "plan.json",
        ),
        (
            "what `check` adds to the flagship's `plan` (whole processes)",
            f"{check['check_adds_s']:.2f} s (target < 1 s: {met})",
            "check.json",
        ),
        (
            "objects in the flagship's in-cluster layer; render and validate them (warm)",
            f"{rendered['objects']}; {rendered['render_validate_warm_s_median'] * 1000:.0f} ms",
            "render.json",
        ),
        (
            "a full scale-up of the flagship's GPU pool under the scale-up governor: the formula, the "
            "simulation's busiest minute",
            f"{60 * flagship['formula_joins_per_second']:.0f} / {flagship['peak_joins_per_minute']:.0f} nodes a minute "
            f"(safe: {storm['safe_join_rate_per_minute']})",
            "join_storm.json",
        ),
        (
            "the same scale-up: minutes until every node joined (upstream defaults: busiest minute)",
            f"{flagship['span_minutes']:.1f} ({upstream['peak_joins_per_minute']:,.0f} nodes a minute)",
            "join_storm.json",
        ),
        (
            "the flagship's series and samples (measured per node x nodes, 30 s scrapes)",
            f"{store['series_m']:.1f} M series, {store['samples_per_s']:,.0f} samples/s, "
            f"{store['gb_per_day']:.0f} GB a day",
            "monitoring.json",
        ),
        (
            f"days the store holds ({store['hosts']} hosts x {store['disk_gib']:,} GiB, replication "
            f"{store['replication']}): measured rate / {SERIES_ALLOWANCE}x allowance",
            f"{store['days_measured']:,.0f} / {store['days_allowance']:,.0f} (retention {store['retention_days']} days)",
            "monitoring.json, flagship stack, metrics_store role",
        ),
        (
            "team webhook admission p99 at 1 / 4 / 32 reviews in flight",
            " / ".join(f"{hook[f'in_flight_{n}']['p99_ms']:.2f}" for n in (1, 4, 32)) + " ms",
            "team_webhook.json",
        ),
        *_join_flow_rows(),
        *_gang_rows(),
        *_autoscaler_rows(),
        *_agents_rows(),
        *_real_nodes_rows(),
        *_training_job_rows(),
        *_dns_rows(),
        *_pod_accounting_rows(),
        *_scale_out_rows(),
        *_ci_rows(),
        (
            "`superkube lab build` from empty caches: "
            + " / ".join(built["cold_per_component_s"])
            + "; in all",
            " / ".join(f"{seconds:.0f}" for seconds in built["cold_per_component_s"].values())
            + f" s; {built['cold_s'] / 60:.1f} min",
            "build.json",
        ),
        (
            "`superkube lab build` again (nothing to build); peak memory of one go process; Go's caches after",
            f"{built['warm_s']:.2f} s; {built['peak_go_rss_mb'] / 1024:.1f} GiB; "
            f"{(built['disk_mb']['go-build'] + built['disk_mb']['go-mod']) / 1024:.1f} GiB",
            "build.json",
        ),
    ]
    return _table(("figure", "value", "from"), rows)


def _ci_rows() -> list[tuple[str, str, str]]:
    """`.ci/run` in a fresh clone (bench/ci_time.py): the whole run against its budget, and the room
    it leaves for the next lab tests."""
    runs = results("ci_time")
    caches = {"warm": "this machine's caches", "cold": "empty build, lab and Go caches"}
    targets = {mode: (TARGET_MIN[mode], caches[mode]) for mode in ("warm", "cold")}
    rows = []
    for mode, (target, held) in targets.items():
        doc = runs.get(mode)
        if doc is None:
            rows.append((f"`.ci/run` in a fresh clone, {held}", "not measured yet", "ci_time.json"))
            continue
        minutes = doc["total_s"] / 60
        steps = doc["steps_s"]
        lab_lane = sum(steps.get(s) or 0 for s in ("build-hosts", "lab")) / 60
        units = sum(v or 0 for k, v in steps.items() if k not in ("build-hosts", "lab")) / 60
        shapes = ", ".join(f"{shape} {s / 60:.1f}" for shape, s in doc["lab_shapes_s"].items())
        rows.append((
            f"`.ci/run` in a fresh clone, {held}: in all (lab lane: its hosts' build, then the lab's "
            f"runs by shape; beside it the units lane)",
            f"{minutes:.1f} min (target {target}{_missed(minutes, target)}){'' if doc['passed'] else ', FAILED'}; "
            f"{lab_lane:.1f} ({shapes}); {units:.1f} min",
            "ci_time.json",
        ))  # fmt: skip
        if mode == "warm":
            room = target - minutes
            rows.append((
                "room in the warm budget for the next lab-testing issues, at the allowance of each",
                f"{room:.1f} min; {ALLOWANCE_MIN} min each, {int(room // ALLOWANCE_MIN)} such "
                + ("issue" if int(room // ALLOWANCE_MIN) == 1 else "issues"),
                "ci_time.json, bench/ci_time.py",
            ))  # fmt: skip
    return rows


def _scale_out_rows() -> list[tuple[str, str, str]]:
    """New GPU instances joining from the baked image against converge's join (bench/scale_out.py)."""
    out = results("scale_out")
    image, today = out["image"], out["converge"]
    return [
        (
            f"{out['count']} GPU instances booted back to back, joining from the baked image and their custom data "
            "alone / booted from the base image and converged: boot -> Ready p50 (max); boot -> schedulable "
            "(past preflight) p50 (max)",
            f"{image['boot_to_ready_p50_s']:.1f} ({image['boot_to_ready_max_s']:.1f}) / "
            f"{today['boot_to_ready_p50_s']:.1f} ({today['boot_to_ready_max_s']:.1f}) s; "
            f"{image['boot_to_schedulable_p50_s']:.1f} ({image['boot_to_schedulable_max_s']:.1f}) / "
            f"{today['boot_to_schedulable_p50_s']:.1f} ({today['boot_to_schedulable_max_s']:.1f}) s; "
            f"converge / image, schedulable p50: {out['ratio_boot_to_schedulable_p50']:.1f}x",
            "scale_out.json",
        ),
        (
            "baking the GPU pool's lab image (a builder booted, converged alone, captured)",
            f"{out['bake_s']:.0f} s",
            "scale_out.json",
        ),
    ]


def _real_nodes_rows() -> list[tuple[str, str, str]]:
    """Real kubelets on the lab's nodes (bench/real_nodes.py)."""
    real = results("real_nodes")
    joined = real["kubelet_to_ready_s"]
    return [
        (
            "lab nodes joining by TLS bootstrap: the kubelet's start to its Node Ready ("
            + " / ".join(joined)
            + ")",
            " / ".join(f"{s:.1f}" for s in joined.values()) + " s",
            "real_nodes.json",
        ),
        (
            f"{real['pods_per_round']} pods at once on one lab node through kubelet, containerd, runc and the "
            f"CNI chain: create -> Ready p50 / slowest (median of {len(real['rounds'])} rounds)",
            f"{real['p50_s_median']:.1f} / {real['p99_s_median']:.1f} s",
            "real_nodes.json",
        ),
        (
            f"the kubelet's RunPodSandbox (containerd and the CNI chain), {real['run_podsandbox_pods_per_round']} "
            "pods at once: our chain (ptp, superkube-bandwidth, portmap) / a stock bridge chain, same node, "
            "alternated (each round's mean in brackets)",
            "{:.0f} / {:.0f} ms = {:.2f}x ({} / {} ms)".format(
                1000 * statistics.mean(real["run_podsandbox_s"]["ours"]),
                1000 * statistics.mean(real["run_podsandbox_s"]["stock_bridge"]),
                real["run_podsandbox_ratio"],
                ", ".join(f"{1000 * v:.0f}" for v in real["run_podsandbox_s"]["ours"]),
                ", ".join(f"{1000 * v:.0f}" for v in real["run_podsandbox_s"]["stock_bridge"]),
            ),
            "real_nodes.json",
        ),
    ]


def _training_job_rows() -> list[tuple[str, str, str]]:
    """The lab's example MPI job on its real nodes (bench/training_job.py)."""
    job = results("training_job")
    return [
        (
            f"an MPI job (launcher + 2 workers) through the real operator, gang scheduler and kubelets: "
            f"submit -> every pod Running / -> Succeeded, p50 / p99 of {len(job['runs'])} runs",
            f"{job['running_p50_s']:.1f} / {job['running_p99_s']:.1f} s; "
            f"{job['succeeded_p50_s']:.1f} / {job['succeeded_p99_s']:.1f} s",
            "training_job.json",
        ),
        (
            f"a pod's DNS lookup of a Service through the layer's CoreDNS: p50 / p99 of {job['dns_lookups']:,}",
            f"{job['dns_p50_ms']:.2f} / {job['dns_p99_ms']:.2f} ms",
            "training_job.json",
        ),
    ]


def _pod_accounting_rows() -> list[tuple[str, str, str]]:
    """Per-pod accounting at the flagship's densities (bench/pod_accounting.py)."""
    got = results("pod_accounting")
    from bench.pod_accounting import ASSUMPTIONS, flagship_costs

    d = got["densities"]
    names = ("node", "gpu", "cpu")
    lat, store = got["latency"], got["store"]
    cost = flagship_costs(got)  # today's stack and assumptions over the measured figures
    by_pool = cost["active_series_by_pool"]

    def each(key: str, fmt: str) -> str:
        return " / ".join(format(d[n][key], fmt) for n in names)

    return [
        (
            f"mangle rules on a node with no pods / a GPU node's {d['gpu']['pods']} / a CPU node's "
            f"{d['cpu']['pods']} (of them per pod; tagged; the exporter's series)",
            f"{each('mangle_rules', 'd')} ({each('per_pod_rules', 'd')}; {each('tagged_rules', 'd')}; "
            f"{each('label_sets', 'd')})",
            "pod_accounting.json",
        ),
        (
            f"the iptables exporter's scrape at those densities / `iptables-save -c` alone (median of "
            f"{got['rounds']} alternated rounds of {got['repeats']})",
            " / ".join(f"{d[n]['exporter_ms']:.1f}" for n in names)
            + " ms = "
            + " / ".join(f"{d[n]['exporter_over_iptables_save']:.2f}x" for n in names),
            "pod_accounting.json",
        ),
        (
            f"the accounting step's ADD / DEL, {lat['pods']} pods one after another: p50 (max); the whole "
            "chain's p50",
            f"{lat['add']['step']['p50_ms']:.0f} ({lat['add']['step']['max_ms']:.0f}) / "
            f"{lat['del']['step']['p50_ms']:.0f} ({lat['del']['step']['max_ms']:.0f}) ms; "
            f"{lat['add']['chain']['p50_ms']:.0f} / {lat['del']['chain']['p50_ms']:.0f} ms",
            "pod_accounting.json",
        ),
        (
            f"the flagship's per-pod series, every pod IP in use ({cost['kept_per_pod']} a pod: bytes; the "
            f"scrape job drops packets): GPU + CPU pools; made a day with GPU pods living "
            f"{ASSUMPTIONS['gpu_pod_hours']:g} h and CPU pods {ASSUMPTIONS['cpu_pod_hours'] * 60:.0f} min",
            f"{by_pool['gpu']:,.0f} + {by_pool['cpu']:,.0f} = {cost['active_series']:,.0f}; "
            f"{cost['series_made_per_day']:,.0f}",
            "pod_accounting.json, flagship stack",
        ),
        (
            f"their cost in the store ({store['victoriametrics'].split('+')[0]}: "
            f"{store['bytes_per_sample']:.2f} bytes a sample, {store['bytes_per_new_series']:.0f} bytes a "
            "series made): a day (the measured series of the rest); at "
            f"{cost['retention_days']} days x {cost['replication']} copies, of the store's disks",
            f"{cost['samples_gb_per_day'] + cost['new_series_gb_per_day']:.1f} GB "
            f"({store_sizing()['gb_per_day']:.0f} GB); "
            f"{cost['store_gb_at_retention']:,.0f} GB, {cost['share_of_store']:.1%}",
            "pod_accounting.json, flagship stack, metrics_store role",
        ),
    ]


def _dns_rows() -> list[tuple[str, str, str]]:
    """The layer's CoreDNS with the flagship's objects (bench/dns.py)."""
    got = results("dns")
    first, again = got["job_start"]
    return [
        (
            f"CoreDNS {got['coredns']} resident: only the API's Service / the flagship's "
            f"({got['objects']['services']:,} Services, {got['objects']['endpoints']:,} endpoints)",
            f"{got['rss_mib']['api_service_only']:.0f} / {got['rss_mib']['flagship_loaded']:.0f} MiB (limit 170 MiB)",
            "dns.json",
        ),
        (
            f"a {got['workers_per_job']:,}-worker job's hostfile through a pod's resolver (ndots:5): "
            "queries / sent to the node's resolver",
            f"{first['hostfile_queries']:,.0f} / {first['hostfile_forwarded']:,.0f}",
            "dns.json",
        ),
        (
            f"{first['outside_names']} names outside the cluster: queries / sent upstream, first and "
            "again within the cache's 30 s",
            f"{first['outside_queries']:,.0f} / {first['outside_forwarded']:,.0f}, "
            f"then {again['outside_queries']:,.0f} / {again['outside_forwarded']:,.0f}",
            "dns.json",
        ),
        (
            "CoreDNS capacity: queries per CPU-second (a Service's name); one client's p50 / p99",
            f"{got['capacity']['queries_per_cpu_s']:,}; {got['capacity']['p50_ms']:.2f} / "
            f"{got['capacity']['p99_ms']:.2f} ms",
            "dns.json",
        ),
    ]


def _gang_rows() -> list[tuple[str, str, str]]:
    """MPIJobs through the real operator and gang scheduler, against the default profile (bench/gang.py)."""
    run = results("gang")
    gang, default = run["profiles"]["gang"], run["profiles"]["default"]
    sizes = " / ".join(str(r["workers"]) for r in gang)

    def each(rows: list[dict[str, Any]], key: str, fmt: str) -> str:
        return " / ".join(format(r[key], fmt) for r in rows)

    def slowest(rows: list[dict[str, Any]]) -> str:
        return " / ".join(
            f"{r['create_to_all_bound_s']:.1f} ({r['create_to_all_bound_max_s']:.0f})" for r in rows
        )

    return [
        (
            f"an MPIJob of {sizes} whole-node workers: creation -> every pod bound, fastest (slowest) of "
            f"{len(gang[0]['runs'])} runs, Coscheduling; the default profile on the same nodes",
            f"{slowest(gang)} s; {slowest(default)} s",
            "gang.json",
        ),
        (
            "the same jobs' fastest runs: pods bound per second (creation -> last bind); first -> last "
            "bind of a gang",
            f"{each(gang, 'pods_bound_per_s', '.1f')} vs {each(default, 'pods_bound_per_s', '.1f')}; "
            f"{each(gang, 'first_to_last_bind_s', '.2f')} s",
            "gang.json",
        ),
    ]


def _autoscaler_rows() -> list[tuple[str, str, str]]:
    """A 1,000-node scale-up by the real cluster-autoscaler, kwok provider (bench/autoscaler.py)."""
    run = results("autoscaler")
    by = {r["setting"]: r for r in run["runs"]}
    flag, base, gov = by["flagship"], by["defaults"], by["governed"]

    def loops(r: dict[str, Any]) -> list[float]:
        """When each scale-up loop began: a loop sets each scale set's size at most once, so a set
        set again starts the next loop."""
        starts: list[float] = []
        seen: set[str] = set()
        for d in r["decisions"]:
            if not starts or d["group"] in seen:
                starts.append(d["s"])
                seen = set()
            seen.add(d["group"])
        return starts

    def spacing(r: dict[str, Any]) -> str:
        starts = loops(r)
        gaps = [b - a for a, b in itertools.pairwise(starts)]
        return f"{len(starts)} loop{'s' if len(starts) != 1 else ''}" + (
            f", {min(gaps):.1f}-{max(gaps):.1f} s apart" if gaps else ""
        )

    def took(r: dict[str, Any]) -> str:
        return f"{r['seconds_to_all_bound'] / 60:.1f} min" if r["seconds_to_all_bound"] else "unfinished"

    return [
        (
            f"cluster-autoscaler {run['version']}: {flag['pods']:,} pending GPU pods, one node each: busiest "
            "minute of nodes added, flagship settings / upstream defaults (formula without jitter; safe)",
            f"{flag['busiest_minute_nodes']} / {base['busiest_minute_nodes']} nodes "
            f"({flag['model_per_min']} / {base['model_per_min']}; safe {flag['safe_join_rate_per_minute']})",
            "autoscaler.json",
        ),
        (
            "the same scale-ups: the loops that scaled up (the formula: one every scan interval, 10 s); "
            "creation -> every pod bound; busiest minute of joins "
            f"with each decision spread over the flagship's {flag['jitter_s']} s jitter (formula)",
            f"{spacing(flag)} / {spacing(base)}; {took(flag)} / {took(base)}; "
            f"{flag['with_jitter_per_min']:.0f} ({flag['model_with_jitter_per_min']:.0f}) / "
            f"{base['with_jitter_per_min']:.0f} ({base['model_with_jitter_per_min']:.0f}) nodes",
            "autoscaler.json",
        ),
        (
            "the same scale-up with the flagship settings and the scale-up governor (room for "
            f"{gov['governor_room_per_refresh']} nodes per one-minute provider refresh): busiest minute of nodes "
            "added (safe); the loops that scaled up; creation -> every pod bound; max-size writes",
            f"{gov['busiest_minute_nodes']} nodes (safe {gov['safe_join_rate_per_minute']}); {spacing(gov)}; "
            f"{took(gov)}; {gov['governor_writes']} writes",
            "autoscaler.json",
        ),
    ]


def _join_flow_rows() -> list[tuple[str, str, str]]:
    """A join storm on the real API server, with and without the join level (bench/join_flow.py)."""
    flow = results("join_flow")
    rounds = flow["rounds"]

    def storm(name: str, idle: str) -> str:
        base, hit = rounds[idle]["p99_ms"], rounds[name]["steady"]["p99_ms"]
        return f"{base:.0f} -> {hit:.0f} ms ({hit / base:.1f}x{_missed(hit / base, 2.0001)})"

    paced = {k: v for k, v in rounds.items() if k.startswith("paced_")}
    with_level, compare = rounds["storm_join_level"], rounds["storm_compare"]
    level, former = flow["level"], flow["compare_level"]
    tokens = (
        "a bootstrap token each" if flow["tokens"] == "per node" else "one bootstrap token, as in production"
    )
    apf = with_level["apf"]
    join_level = apf.get("superkube-node-join", {})
    dispatched = sum(row["dispatched"] for row in apf.values())
    return [
        (
            f"{flow['joins']:,} kubelets' TLS bootstraps (CSR, its watch, Node, Lease; {tokens}), "
            f"{flow['concurrency']} at once, on one lab API server core (the role's in-flight limits / "
            f"{flow['scale']}): a user's p99, idle -> storm, built-in levels only; with superkube-node-join "
            f"({level['shares']} share, {level['queues']} queues of {level['queue_length_limit']}; target within 2x)",
            f"{storm('storm_builtin', 'idle_builtin')}; {storm('storm_join_level', 'idle_join_level')}",
            "join_flow.json",
        ),
        (
            "that storm with superkube-node-join: joins a second; 429s; a join's p99; the user's errors; "
            "requests the join level dispatched, of all the server's, and their mean wait / run",
            f"{with_level['joins_per_s']:.0f}; {with_level['throttled_429']}; {with_level['join_p99_s']:.1f} s; "
            f"{with_level['steady']['errors']}; {join_level.get('dispatched', 0):,.0f} of {dispatched:,.0f}, "
            f"{join_level.get('mean_wait_ms', 0):.0f} / {join_level.get('mean_execution_ms', 0):.0f} ms",
            "join_flow.json",
        ),
        (
            "joins paced at "
            + " / ".join(k.removeprefix("paced_").removesuffix("_per_s") for k in paced)
            + " a second, with superkube-node-join: the user's p99 / idle",
            " / ".join(
                f"{r['steady']['p99_ms'] / rounds['idle_join_level']['p99_ms']:.1f}x" for r in paced.values()
            ),
            "join_flow.json",
        ),
        (
            f"the storm again, the join level at the former default, {former['shares']} shares and "
            f"{former['queues']} queues of {former['queue_length_limit']}: the user's p99; joins a second; "
            "429s; failed joins",
            f"{storm('storm_compare', 'idle_compare')}; {compare['joins_per_s']:.0f}; "
            f"{compare['throttled_429']:,}; {compare['failed']}",
            "join_flow.json",
        ),
    ]


def _missed(value: float, target: float) -> str:
    return "" if value < target else ": missed"


def _agents_rows() -> list[tuple[str, str, str]]:
    """The node agents at the largest fleet measured (bench/agents_at_scale.py)."""
    scale = results("agents_at_scale")
    sizes = scale["sizes"]
    top = sizes[-1]
    n = f"{top['nodes']:,}"
    counts = " / ".join(f"{row['nodes']:,}" for row in sizes)

    def curve(kind: str) -> str:
        return " / ".join(f"{row['peak_rss_mib'][kind]:.0f}" for row in sizes)

    burst = top["burst_requests"]
    return [
        (
            f"peak RSS at {counts} kwok GPU Nodes (~{scale['node_json_bytes'] / 1000:.0f} KB each, "
            f"+ {scale['cpu_nodes']} CPU nodes): the health controller; the team reconciler; a health agent",
            f"{curve('controller')} MiB (limit 512 MiB); {curve('team_reconciler')} MiB (limit 256 MiB); "
            f"{curve('health_agent_max')} MiB (limit 256 MiB)",
            "agents_at_scale.json",
        ),
        (
            f"at {n} nodes, steady state: requests a minute of the controller, the team reconciler, a health agent",
            " / ".join(
                f"{top['steady_requests_per_min'][k]:.0f}"
                for k in ("controller", "team_reconciler", "health_agent_max")
            ),
            "agents_at_scale.json",
        ),
        (
            f"at {n} nodes, {top['reports']} nodes ({scale['fault_share']:.0%} and 3 more) fail at once: requests "
            "of the controller, the reconciler, a failing node's agent, a healthy node's agent",
            f"{burst['controller']:,} / {burst['team_reconciler']} / {burst['health_agent_on_a_failing_node_max']} / "
            f"{burst['health_agent_on_a_healthy_node_max']}: {top['cordoned']} cordons (breaker allows "
            f"{top['breaker_allowed']}), {top['evicted']} evictions",
            "agents_at_scale.json",
        ),
        (
            f"every agent of the fleet in that burst (controller, reconciler, {top['nodes']:,} health agents); "
            f"per failed node, at {counts}",
            f"{top['burst_all_agents_requests']:,} requests in {top['burst_window_s']:.0f} s; "
            + " / ".join(f"{row['burst_requests_per_failure']:.1f}" for row in sizes),
            "agents_at_scale.json",
        ),
        (
            f"at {n} nodes: from one fatal report to its cordon; from {top['reports']} at once to the last "
            "cordon, and to the last evicted pod gone",
            f"{top['one_report_to_cordon_s']:.1f} s; {top['report_to_last_cordon_s']:.1f} s, "
            f"{top['report_to_last_pod_gone_s']:.1f} s",
            "agents_at_scale.json",
        ),
        (
            f"kwok: new nodes made and all Ready at {counts}; the API server's peak RSS",
            " / ".join(f"{row['all_ready_s']:.0f}" for row in sizes)
            + " s; "
            + " / ".join(f"{row['apiserver_peak_rss_mib'] / 1024:.1f}" for row in sizes)
            + " GiB",
            "agents_at_scale.json",
        ),
    ]


def monitoring_table() -> str:
    """The monitoring store's measured table, from bench/monitoring.py's results."""
    monitoring = results("monitoring")
    per_host, store = monitoring["series_per_host"], monitoring["store"]
    labels = {
        "node-exporter": "node-exporter series per lab host, before -> after the drop rules",
        "iptables-exporter": "iptables exporter series per host",
        "etcd": "a real etcd member's page",
        "apiserver (synthetic page)": "an API-server-shaped page (synthetic: 20 label sets of the request histogram)",
    }
    rows = [(labels[k], f"{v['before']:,.0f} -> {v['after']:,.0f}") for k, v in per_host.items()]
    rows += [
        (
            f"ingestion into VictoriaMetrics (import of {store['samples']:,} samples until all are queryable)",
            f"{store['ingest_samples_per_second']:,.0f} samples/s",
        ),
        (
            "bytes per sample on disk: VictoriaMetrics vs a Prometheus TSDB block of the same data",
            f"{store['victoriametrics_bytes_per_sample']:.2f} vs {store['prometheus_tsdb_bytes_per_sample']:.2f}",
        ),
    ]
    return _table(("what", "measured"), rows)


def sizing_phrases() -> list[str]:
    """The monitoring guide's sizing sentence, figure by figure, as docs/07-monitoring.md must say it."""
    store = store_sizing()
    return [
        f"The flagship's {store['nodes']:,} nodes at {store['series_per_node']:,.0f} series each",
        f"at least {store['series_m']:.1f} M series",
        f"{round(store['samples_per_s'], -3):,.0f} samples/s",
        f"{store['gb_per_day']:.0f} GB a day",
        f"{results('monitoring')['store']['victoriametrics_bytes_per_sample']:.1f} bytes per sample",
        f"about {store['series_m'] * SERIES_ALLOWANCE:.0f} M series, "
        f"{store['samples_per_s'] * SERIES_ALLOWANCE / 1e6:.1f} M samples/s",
    ]


BLOCKS = {"summary": summary_table, "monitoring": monitoring_table}


def markers(name: str) -> tuple[str, str]:
    return f"<!-- figures:{name}:begin (bench/figures.py --write) -->", f"<!-- figures:{name}:end -->"


def _table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])


def block(name: str) -> str:
    begin, end = markers(name)
    return "\n".join([begin, BLOCKS[name](), end])


def written_block(text: str, name: str) -> str:
    """The block as a page holds it, markers included."""
    begin, end = markers(name)
    return text[text.index(begin) : text.index(end) + len(end)]


def pages() -> list[Path]:
    """Every page a block may live in: the README and the guides."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def home(name: str) -> Path:
    """The one page that holds the block's markers."""
    begin, _ = markers(name)
    found = [page for page in pages() if begin in page.read_text()]
    if len(found) != 1:
        where = ", ".join(str(p.relative_to(ROOT)) for p in found) or "no page"
        raise SystemExit(f"the {name} block's markers must be in exactly one page, found in {where}")
    return found[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="rewrite the blocks in the page holding each")
    args = parser.parse_args()
    for name in BLOCKS:
        page, made = home(name), block(name)
        print(made)
        if args.write:
            text = page.read_text()
            page.write_text(text.replace(written_block(text, name), made))


if __name__ == "__main__":
    main()
