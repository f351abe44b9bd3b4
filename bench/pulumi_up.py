"""The in-cluster layer through the real Pulumi engine and Kubernetes provider, against the pinned
kube-apiserver: `pulumi up`, a no-op `up`, an update of one input, `destroy`, and the CrossGuard
pack on the real engine.

Run: .venv/bin/python bench/pulumi_up.py [--keep DIR]
     [--runs 2] (a few minutes a run; needs scripts/build_pulumi.py run once; prints each step's
     time and whether every check held; writes bench/results/pulumi_up.json; exit 1 if one did not)

What runs: `superkube.harness.apiserver` (the pinned etcd and kube-apiserver the lab's hosts run,
from the same build, on loopback) with kube-controller-manager's garbage collector and namespace
controller (what `destroy` waits on: foreground deletion and a namespace's finalizer); no nodes.
The project is this checkout's Pulumi program, run from a scratch folder that links it and holds the
stack file: the flagship's config (the lab's stack) with `superkube:layer_only` (the layer alone,
its provider from the kubeconfig secret, nothing of Azure) and the lab's settings from config (no
balloon replicas, preflight without the burn, no periodic GPU test, the health breaker at every
node) plus `kubernetes_await: false` (no node will ever make a workload ready). Its secrets (the
admin kubeconfig, the team webhook's certificate bundle) are set with `pulumi config set --secret`
and encrypted with a passphrase, in a local file backend.

Checked, each against the mock engine's plan of the same stack (`superkube plan`'s engine, with
the same secrets):
- first `up`: the state holds exactly the plan's resources (same types and names; the URNs of
  resources below a component's child differ, see the guide) with the plan's dependencies, every
  object the plan lists exists in the API server with every field the plan gives it (values the
  server writes in canonical form, such as quantities, compared as values), the team webhook's
  Secret holds the bundle's key pair, and no private key is in the backend or stack file in the clear;
- a second `up` reports no changes (`--expect-no-changes`);
- an update of one input (rack group b's GPU capacity moves from research to pretraining) changes
  exactly the objects whose manifests the plans before and after differ in;
- `destroy` leaves none of the layer's objects in the API server;
- CrossGuard: `pulumi preview --policy-pack policies --policy-pack-config <superkube policy-config>`
  reports, rule by rule, the violations `superkube check` reports for the same stack: the stack
  above (the autoscaler's discovery filter matches no scale set of a layer-only stack: a Kubernetes
  rule that breaks) and that stack with the autoscaler off (no Kubernetes rule breaks). On a
  layer-only stack the Azure rules report the missing machines in both, the same way.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "src")]

import yaml  # noqa: E402

from superkube.harness import apiserver, build, pulumi_engine  # noqa: E402
from superkube.lab.state import LAB_STACK  # noqa: E402
from superkube.model.spec import KUBECONFIG_KEY, SpecError  # noqa: E402
from superkube.model.teams import WEBHOOK_TLS_KEY  # noqa: E402
from superkube.plan import engine as planning  # noqa: E402
from superkube.plan import layer  # noqa: E402
from superkube.plan.engine import Plan  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "pulumi_up.json"
STACK = "lab-layer"
PASSING = "lab-layer-no-autoscaler"
PASSPHRASE = "superkube-bench"  # encrypts the bench stack's secrets, which live only in its scratch folder
LAB_SETTINGS = {
    "cluster_name": LAB_STACK,
    "layer_only": True,
    "balloons_enabled": False,
    "gpu_burn_seconds": 0,
    "gpu_test_schedule": "",
    "health_max_cordoned_share": 1.0,
    "kubernetes_await": False,
}
"""The lab's adjustments as config (what `superkube.lab.agent_pods` does to objects for the lab's
hosts, where config has a key for it) and the layer alone."""
LINKED = ("__main__.py", "modules", ".venv")
CONTROLLERS = ("garbagecollector", "namespace")
WEBHOOK_DNS = "superkube-team-webhook.superkube-system.svc"
GONE_TIMEOUT_S = 120


class BenchError(Exception):
    pass


def log(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


# --- the stack ------------------------------------------------------------------------------------


def stack_text(base: str, settings: Mapping[str, Any], teams: str | None = None) -> str:
    """The flagship's stack file with `settings` added (replacing a key it already has) and, if given,
    its teams document replaced."""
    doc = yaml.safe_load(base)
    config: dict[str, Any] = doc["config"]
    for key, value in settings.items():  # a float as a string: see project_file
        config[f"superkube:{key}"] = str(value) if isinstance(value, float) else value
    if teams is not None:
        config["superkube:teams"] = teams
    return yaml.safe_dump({"config": config}, sort_keys=False, width=1000)


def moved_rack(teams: str) -> str:
    """The update: rack group b's capacity moves from research to pretraining."""
    tuples = yaml.safe_load(teams)
    moved = False
    for t in tuples:
        if t.get("selector", {}).get("superkube.io/rack-group") == "b" and t.get("team") == "research":
            t["team"] = "pretraining"
            moved = True
    if not moved:
        raise BenchError(
            "the flagship's teams no longer give rack group b to research: choose another update"
        )
    return str(yaml.safe_dump(tuples, sort_keys=False))


def project_file() -> tuple[dict[str, Any], list[str]]:
    """Pulumi.yaml as the CLI accepts it, and what had to change: the CLI's project schema types config
    only as string, integer, boolean, array or object, and refuses the whole file for a `number`. The
    generator (superkube.plan.schema) declares a float key a string since this bench found it; should
    a `number` come back, it is declared a string here and recorded in the results."""
    doc = yaml.safe_load((ROOT / "Pulumi.yaml").read_text())
    fixed = []
    for key, decl in (doc.get("config") or {}).items():
        if decl.get("type") == "number":
            decl["type"] = "string"
            decl["default"] = str(decl.get("default", ""))
            fixed.append(f"{key}: type number -> string")
    return doc, fixed


def project(work: Path, stacks: Mapping[str, str]) -> Path:
    """A scratch project: the checkout's program linked, Pulumi.yaml copied, its own stack files, and
    the policy pack linked with the checkout's virtualenv as the pack's."""
    proj = work / "project"
    (proj / "stacks").mkdir(parents=True)
    (proj / "Pulumi.yaml").write_text(yaml.safe_dump(project_file()[0], sort_keys=False, width=1000))
    for name in LINKED:
        (proj / name).symlink_to(ROOT / name)
    pack = proj / "policies"
    pack.mkdir()
    for item in (ROOT / "policies").iterdir():
        if item.name not in ("venv", "__pycache__"):
            (pack / item.name).symlink_to(item)
    (pack / "venv").symlink_to(ROOT / ".venv")
    for name, text in stacks.items():
        (proj / "stacks" / f"Pulumi.{name}.yaml").write_text(text)
    return proj


def inline_kubeconfig(api: apiserver.LocalApi) -> str:
    """The admin kubeconfig with its files inlined: what `pulumi config set --secret` is given."""
    doc = json.loads(api.kubeconfig.read_text())
    cluster = doc["clusters"][0]["cluster"]
    cluster["certificate-authority-data"] = base64.b64encode(
        Path(cluster.pop("certificate-authority")).read_bytes()
    ).decode()
    user = doc["users"][0]["user"]
    for key in ("client-certificate", "client-key"):
        user[f"{key}-data"] = base64.b64encode(Path(user.pop(key)).read_bytes()).decode()
    return json.dumps(doc)


def webhook_bundle(pki: Path) -> str:
    """The team webhook's certificate, key and CA, signed by the API server's CA (as converge signs it)."""

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=pki, check=True, capture_output=True)

    openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-subj",
            f"/CN={WEBHOOK_DNS}", "-keyout", "webhook.key", "-out", "webhook.csr")  # fmt: skip
    (pki / "webhook.cnf").write_text(f"subjectAltName=DNS:{WEBHOOK_DNS}\nextendedKeyUsage=serverAuth\n")
    openssl("x509", "-req", "-in", "webhook.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
            "-days", "2", "-extfile", "webhook.cnf", "-out", "webhook.crt")  # fmt: skip
    return "".join((pki / f).read_text() for f in ("webhook.crt", "webhook.key", "ca.crt"))


# --- the Pulumi CLI -------------------------------------------------------------------------------


class Cli:
    def __init__(self, bin_dir: Path, proj: Path, work: Path) -> None:
        self.proj = proj
        self.env = {
            **os.environ,
            "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
            "PULUMI_HOME": str(work / "pulumi-home"),
            "PULUMI_CONFIG_PASSPHRASE": PASSPHRASE,
            "PULUMI_SKIP_UPDATE_CHECK": "true",
            "PULUMI_DISABLE_AUTOMATIC_PLUGIN_ACQUISITION": "true",
            "PULUMI_SKIP_CONFIRMATIONS": "true",
            "NO_COLOR": "1",
        }
        self.env.pop("VIRTUAL_ENV", None)
        self.log = work / "pulumi.log"

    def __call__(
        self, *args: str, stdin: str | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        with self.log.open("a") as sink:
            sink.write(f"\n$ pulumi {' '.join(args)}\n")
        done = subprocess.run(["pulumi", "--non-interactive", "--color=never", *args], cwd=self.proj,
                              env=self.env, input=stdin, capture_output=True, text=True)  # fmt: skip
        with self.log.open("a") as sink:
            sink.write(done.stdout + done.stderr + f"[exit {done.returncode}]\n")
        if check and done.returncode != 0:
            tail = [line for line in (done.stderr + done.stdout).splitlines() if line.strip()][-8:]
            raise BenchError(f"pulumi {args[0]} failed (exit {done.returncode}): " + " | ".join(tail))
        return done

    def timed(self, *args: str, check: bool = True) -> tuple[float, subprocess.CompletedProcess[str]]:
        started = time.monotonic()
        done = self(*args, check=check)
        return round(time.monotonic() - started, 2), done

    def state(self, stack: str) -> list[dict[str, Any]]:
        exported = json.loads(self("stack", "export", "--stack", stack).stdout)
        resources: list[dict[str, Any]] = exported.get("deployment", {}).get("resources") or []
        return resources


def steps(preview_json: str) -> dict[str, str]:
    """URN -> operation of every step a `pulumi preview --json` plans other than `same`."""
    doc = json.loads(preview_json)
    return {short(s["urn"]): s["op"] for s in doc.get("steps") or [] if s.get("op") != "same"}


# --- comparing the plan with the API server -------------------------------------------------------

_QUANTITY = re.compile(r"^([0-9.]+)(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$")
_FACTOR = {"": 1, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18,
           "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}  # fmt: skip


def _quantity(value: Any) -> float | None:
    m = (
        _QUANTITY.match(str(value))
        if isinstance(value, str | int | float) and not isinstance(value, bool)
        else None
    )
    return float(m.group(1)) * _FACTOR[m.group(2) or ""] if m else None


def differences(planned: Any, live: Any, path: str = "") -> Iterator[str]:
    """Every field the plan gives that the live object lacks or holds another value in (a subset
    comparison: the server adds defaults and status). Quantities are compared as values."""
    if isinstance(planned, dict):
        if not isinstance(live, dict):
            yield f"{path}: planned a mapping, the server has {live!r}"
            return
        for key, value in planned.items():
            if key not in live:
                if value not in (None, {}, [], False):  # the server drops empty and false fields
                    yield f"{path}.{key}: planned {value!r}, the server has none"
                continue
            yield from differences(value, live[key], f"{path}.{key}")
    elif isinstance(planned, list):
        if not isinstance(live, list) or len(live) != len(planned):
            yield f"{path}: planned {len(planned)} items, the server has {live!r}"[:300]
            return
        for i, (a, b) in enumerate(zip(planned, live, strict=True)):
            yield from differences(a, b, f"{path}[{i}]")
    elif planned != live:
        a, b = _quantity(planned), _quantity(live)
        if a is None or b is None or abs(a - b) > 1e-9 * max(abs(a), 1):
            yield f"{path}: planned {planned!r}, the server has {live!r}"


def key_of(obj: Mapping[str, Any]) -> tuple[str, str, str, str]:
    group = obj["apiVersion"].rpartition("/")[0]
    meta = obj["metadata"]
    return group, obj["kind"], meta.get("namespace", ""), meta["name"]


def planned_objects(plan: Plan) -> dict[tuple[str, str, str, str], dict[str, Any]]:
    return {key_of(o): o for objs in layer.objects(plan).values() for o in objs}


def live_objects(
    api: apiserver.LocalApi, keys: list[tuple[str, str, str, str]]
) -> dict[tuple[str, str, str, str], Any]:
    """The objects of `keys` the API server holds (one kubectl per namespace; a missing one is absent)."""
    found: dict[tuple[str, str, str, str], Any] = {}
    by_namespace: dict[str, list[tuple[str, str, str, str]]] = {}
    for k in keys:
        by_namespace.setdefault(k[2], []).append(k)
    for namespace, ks in by_namespace.items():
        names = [f"{kind.lower()}{'.' + group if group else ''}/{name}" for group, kind, _, name in ks]
        args = ["get", *names, "-o", "json", "--ignore-not-found"] + (["-n", namespace] if namespace else [])
        out = apiserver.kubectl(api, *args, check=False)
        items = json.loads(out)["items"] if out.strip().startswith("{") and '"items"' in out else (
            [json.loads(out)] if out.strip() else []
        )  # fmt: skip
        for item in items:
            found[key_of(item)] = item
    return found


def dependencies_differ(plan: Plan, state: list[dict[str, Any]]) -> dict[str, list[list[str]]]:
    """Resources whose dependencies in the state are not the plan's: `<type>::<name>` -> [plan's, state's]."""
    planned = {short(r.urn): sorted(short(d) for d in r.dependencies) for r in plan.resources}
    out = {}
    for r in state:
        key = short(r["urn"])
        got = sorted(short(d) for d in r.get("dependencies") or [])
        if key in planned and got != planned[key]:
            out[key] = [planned[key], got]
    return out


def secrets_held(
    api: apiserver.LocalApi, stored_in: list[Path], kubeconfig: str, bundle: str
) -> dict[str, bool]:
    """The webhook's key pair reached its Secret whole, and neither it nor the admin's client key is in
    the backend's or the stack files in the clear (as PEM, or base64 as a Secret or kubeconfig holds it)."""
    from superkube.model import teams

    cert, key, _ = teams.split_bundle(bundle)
    live = json.loads(apiserver.kubectl(api, "get", "secret", teams.WEBHOOK_TLS_SECRET, "-n", "superkube-system",
                                        "-o", "json"))  # fmt: skip
    data = {k: base64.b64decode(v).decode() for k, v in (live.get("data") or {}).items()}
    client_key = base64.b64decode(json.loads(kubeconfig)["users"][0]["user"]["client-key-data"]).decode()
    stored = "".join(f.read_text(errors="replace") for d in stored_in for f in d.rglob("*") if f.is_file())

    def clear(pem: str) -> bool:
        body = "".join(line for line in pem.splitlines() if line and not line.startswith("-----"))
        # a stretch of the key itself, past the header every PEM key shares
        return body[10:50] in stored or base64.b64encode(pem.encode()).decode()[60:100] in stored

    return {
        "webhook_key_pair_in_its_secret": data.get("tls.crt") == cert and data.get("tls.key") == key,
        "webhook_key_not_stored_in_the_clear": not clear(key),
        "client_key_not_stored_in_the_clear": not clear(client_key),
    }


def compare(plan: Plan, api: apiserver.LocalApi) -> dict[str, Any]:
    planned = planned_objects(plan)
    live = live_objects(api, list(planned))
    missing = [k for k in planned if k not in live]
    diffs: dict[str, list[str]] = {}
    for k, obj in planned.items():
        if k not in live:
            continue
        want = dict(obj)
        if obj["kind"] == "Secret" and "data" in obj:  # the plan never holds a secret's value
            want.pop("data")
            if not live[k].get("data"):
                diffs.setdefault("/".join(k), []).append(".data: the server holds none")
        found = list(differences(want, live[k]))
        if found:
            diffs.setdefault("/".join(k), []).extend(found)
    return {"planned": len(planned), "found": len(planned) - len(missing),
            "missing": ["/".join(k) for k in missing], "differences": diffs}  # fmt: skip


def short(urn: str) -> str:
    """A URN without its parents' types: `<type>::<name>`. The mock engine's URNs differ from the real
    engine's there (see the guide), and a resource's type and name are unique in a stack."""
    parts = urn.split("::")
    return f"{parts[2].rpartition('$')[2]}::{parts[-1]}"


def changed(before: Plan, after: Plan) -> dict[str, str]:
    """URN -> the operation the plans before and after call for: objects whose inputs differ."""
    old = {short(r.urn): r.inputs for r in before.resources if r.custom}
    new = {short(r.urn): r.inputs for r in after.resources if r.custom}
    out = {u: "create" for u in new if u not in old}
    out.update({u: "delete" for u in old if u not in new})
    out.update({u: "update" for u in new if u in old and new[u] != old[u]})
    return out


# --- CrossGuard -----------------------------------------------------------------------------------

_VIOLATION = re.compile(r"^\s*- \[(mandatory|advisory)\] (?:\[severity: \w+\]\s+)?([a-z0-9-]+)\s+\(", re.M)


def policy_violations(output: str) -> dict[str, list[str]]:
    """Rule -> the messages of its violations, from `pulumi preview --policy-pack`'s output: each is
    `- [mandatory] [severity: high]  <rule>  (<type>: <name>)`, the rule's description, the message."""
    found: dict[str, list[str]] = {}
    lines = output.splitlines()
    for i, line in enumerate(lines):
        m = _VIOLATION.match(line)
        if m:
            message = lines[i + 2].strip() if i + 2 < len(lines) else ""
            found.setdefault(m.group(2), []).append(message)
    return {k: sorted(v) for k, v in sorted(found.items())}


def check_violations(proj: Path, stack: str) -> dict[str, list[str]]:
    """Rule -> the messages of the violations `superkube check` reports for the same stack."""
    done = subprocess.run([str(ROOT / ".venv" / "bin" / "superkube"), "check", "--project", str(proj), "-s", stack,
                           "-o", "json"], capture_output=True, text=True)  # fmt: skip
    if done.returncode not in (0, 1):
        raise BenchError(f"superkube check -s {stack} failed: {done.stderr.strip()[-300:]}")
    report = json.loads(done.stdout)
    return {
        r["rule"]: sorted(v["message"] for v in r["violations"]) for r in report["rules"] if r["violations"]
    }


def crossguard(cli: Cli, proj: Path, work: Path, stack: str) -> dict[str, Any]:
    config = subprocess.run([str(ROOT / ".venv" / "bin" / "superkube"), "policy-config", "--project", str(proj),
                             "-s", stack], capture_output=True, text=True, check=True).stdout  # fmt: skip
    path = work / f"policy-config-{stack}.json"
    path.write_text(config)
    seconds, done = cli.timed("preview", "--stack", stack, "--policy-pack", str(proj / "policies"),
                              "--policy-pack-config", str(path), check=False)  # fmt: skip
    real = policy_violations(done.stdout + done.stderr)
    offline = check_violations(proj, stack)
    kube = sorted({r for r in [*real, *offline] if r.startswith(("platform-", "jobs-"))})
    return {
        "stack": stack,
        "seconds": seconds,
        "exit": done.returncode,
        "real_engine": real,
        "superkube_check": offline,
        "same": real == offline,
        "kubernetes_rules_violated": {r: [len(real.get(r, [])), len(offline.get(r, []))] for r in kube},
        "pack_ran": "Loading policy packs...: done" in done.stdout,
    }


# --- the run --------------------------------------------------------------------------------------


def run(
    work: Path, bin_dir: Path, manifest: Mapping[str, Any], progress: Callable[[str], None]
) -> dict[str, Any]:
    base = (ROOT / "stacks" / f"Pulumi.{LAB_STACK}.yaml").read_text()
    teams = yaml.safe_load(base)["config"]["superkube:teams"]
    spec_cidr = yaml.safe_load(base)["config"]["superkube:service_cidr"]
    main_text = stack_text(base, LAB_SETTINGS)
    stacks = {
        STACK: main_text,
        PASSING: stack_text(base, {**LAB_SETTINGS, "autoscaler_enabled": False}),
    }
    proj = project(work, stacks)
    result: dict[str, Any] = {
        "stack": STACK,
        "settings": LAB_SETTINGS,
        "pulumi_yaml_fixes": project_file()[1],
    }
    with apiserver.running(work / "api", progress, flags=[f"--service-cluster-ip-range={spec_cidr}"]) as api:
        api.start_controller_manager(list(CONTROLLERS))
        kubeconfig = inline_kubeconfig(api)
        bundle = webhook_bundle(api.dir / "pki")
        secrets = {KUBECONFIG_KEY: kubeconfig, WEBHOOK_TLS_KEY: bundle}
        plan = planning.run(proj, STACK, secrets=secrets)
        result["plan"] = {"resources": len(plan.resources), "objects": len(planned_objects(plan)),
                          "seconds": round(plan.seconds, 2)}  # fmt: skip
        cli = Cli(bin_dir, proj, work)
        result["versions"] = versions(cli, manifest)
        (work / "state").mkdir()
        cli("login", f"file://{work / 'state'}")
        for name in stacks:
            cli("stack", "init", name, "--secrets-provider", "passphrase")
            # as the guides say: the value on stdin, never on a command line
            cli("config", "set", "--secret", "--stack", name, KUBECONFIG_KEY, stdin=kubeconfig)
            cli("config", "set", "--secret", "--stack", name, WEBHOOK_TLS_KEY, stdin=bundle)

        progress("pulumi up (first)")
        seconds, _ = cli.timed("up", "--stack", STACK, "--yes", "--skip-preview")
        state = cli.state(STACK)
        urns = {r["urn"] for r in state if not r["type"].startswith("pulumi:pulumi:Stack")}
        planned_urns = {r.urn for r in plan.resources}
        result["first_up"] = {
            "seconds": seconds,
            "state_resources": len(urns),
            "plan_resources": len(planned_urns),
            "only_in_state": sorted({short(u) for u in urns} - {short(u) for u in planned_urns}),
            "only_in_plan": sorted({short(u) for u in planned_urns} - {short(u) for u in urns}),
            "same_urns": len(urns & planned_urns),
            "urns_differing_in_parent_types": len({short(u) for u in urns - planned_urns}),
            "api_server": compare(plan, api),
            "dependencies_differ": dependencies_differ(plan, state),
            "secrets": secrets_held(api, [work / "state", proj / "stacks"], kubeconfig, bundle),
        }
        progress(
            f"first up: {seconds} s; {json.dumps({k: v for k, v in result['first_up'].items() if k != 'api_server'})}"
        )

        progress("pulumi up (no changes expected)")
        seconds, done = cli.timed("up", "--stack", STACK, "--yes", "--expect-no-changes", check=False)
        result["noop_up"] = {"seconds": seconds, "no_changes": done.returncode == 0,
                             "tail": (done.stdout + done.stderr).strip().splitlines()[-6:]}  # fmt: skip

        progress("pulumi up (rack group b moves to pretraining)")
        after_text = stack_text(base, LAB_SETTINGS, moved_rack(teams))
        # a copy of the stack file with the new teams, keeping the secrets pulumi config set wrote
        stack_file = proj / "stacks" / f"Pulumi.{STACK}.yaml"
        written = yaml.safe_load(stack_file.read_text())
        written["config"]["superkube:teams"] = yaml.safe_load(after_text)["config"]["superkube:teams"]
        stack_file.write_text(yaml.safe_dump(written, sort_keys=False, width=1000))
        after = planning.run(proj, STACK, secrets=secrets)
        expected = changed(plan, after)
        preview = cli("preview", "--stack", STACK, "--json")
        planned_steps = steps(preview.stdout)
        seconds, _ = cli.timed("up", "--stack", STACK, "--yes", "--skip-preview")
        result["update"] = {
            "change": "superkube:teams: rack group b's tuple moves from research to pretraining",
            "seconds": seconds,
            "expected_from_mock_plans": expected,
            "real_engine_steps": planned_steps,
            "same": expected == planned_steps,
            "api_server": compare(after, api),
        }
        progress(
            f"update: {seconds} s, {len(planned_steps)} steps, as the plans expect: {expected == planned_steps}"
        )

        progress("CrossGuard on the real engine")
        result["crossguard"] = [crossguard(cli, proj, work, STACK), crossguard(cli, proj, work, PASSING)]

        progress("pulumi destroy")
        seconds, _ = cli.timed("destroy", "--stack", STACK, "--yes", "--skip-preview")
        left = live_objects(api, list(planned_objects(after)))
        at_end = {"/".join(k): (o.get("status") or {}).get("phase", "present") for k, o in left.items()}
        # without await the provider does not wait for a namespace's finalizer; the controller ends it
        deadline = time.monotonic() + GONE_TIMEOUT_S
        while left and time.monotonic() < deadline:
            time.sleep(1)
            left = live_objects(api, list(left))
        result["destroy"] = {"seconds": seconds, "objects_at_destroys_end": at_end,
                             "objects_left": ["/".join(k) for k in left],
                             "gone_within_s": None if left else round(time.monotonic() - deadline + GONE_TIMEOUT_S, 1),
                             "state_left": len(cli.state(STACK))}  # fmt: skip
    result["build"] = dict(manifest.get("built") or {})
    return result


def versions(cli: Cli, manifest: Mapping[str, Any]) -> dict[str, str]:
    """What ran: the CLI (as it says), the language host and provider (as built), the Python SDKs the
    program and the pack ran on, and the API server and etcd (the lab's pinned build)."""
    built = manifest.get("built") or {}
    pinned = {c.name: c.version for c in build.components() if c.name in ("kubernetes", "etcd")}
    return {
        "pulumi": cli("version").stdout.strip(),
        "pulumi-language-python": str((built.get("language_host") or {}).get("version")),
        "pulumi-resource-kubernetes": str((built.get("provider") or {}).get("version")),
        **{
            f"python {name}": metadata.version(name)
            for name in ("pulumi", "pulumi_kubernetes", "pulumi_policy")
        },
        "kube-apiserver": pinned.get("kubernetes", "?"),
        "etcd": pinned.get("etcd", "?"),
    }


STEPS = ("first_up", "noop_up", "update", "destroy")


def passed(run: Mapping[str, Any]) -> bool:
    """Every check of one run held (see the module doc)."""
    first, update = run["first_up"], run["update"]
    return (
        not first["only_in_state"] and not first["only_in_plan"] and not first["dependencies_differ"]
        and all(first["secrets"].values())
        and not first["api_server"]["missing"] and not first["api_server"]["differences"]
        and run["noop_up"]["no_changes"]
        and update["same"] and not update["api_server"]["missing"] and not update["api_server"]["differences"]
        and not run["destroy"]["objects_left"] and run["destroy"]["state_left"] == 0
        and all(c["pack_ran"] and c["same"] for c in run["crossguard"])
    )  # fmt: skip


def main() -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument(
        "--keep", type=Path, help="run in this (new or empty) folder and keep it, state and logs included"
    )
    p.add_argument(
        "--cache", type=Path, default=build.CACHE_DIR, help="the build cache scripts/build_pulumi.py filled"
    )
    p.add_argument("--runs", type=int, default=2, help="whole runs, each on a fresh API server (default 2)")
    args = p.parse_args()
    manifest = pulumi_engine.manifest(args.cache)
    if manifest is None:
        print(f"pulumi_up: no Pulumi build in {pulumi_engine.entry(args.cache)}: run scripts/build_pulumi.py first",
              file=sys.stderr)  # fmt: skip
        return 2
    if args.keep and args.keep.exists() and any(args.keep.iterdir()):
        print(f"pulumi_up: --keep {args.keep} is not empty: give a new or empty folder", file=sys.stderr)
        return 2
    if not 1 <= args.runs <= 10:
        print(f"pulumi_up: --runs {args.runs}: give 1 to 10", file=sys.stderr)
        return 2
    bin_dir = pulumi_engine.entry(args.cache) / "bin"
    runs = []
    with tempfile.TemporaryDirectory(prefix="superkube-pulumi-up-") as tmp:
        for n in range(1, args.runs + 1):
            work = (args.keep or Path(tmp)) / f"run-{n}"
            work.mkdir(parents=True)
            try:
                runs.append(run(work.resolve(), bin_dir, manifest, log))
            except (BenchError, planning.PlanError, apiserver.ApiServerError, SpecError) as error:
                kept = work / "pulumi.log"
                if not args.keep and kept.exists():  # the scratch folder goes: keep the CLI's output
                    kept = Path(shutil.copy(kept, tempfile.mkstemp(prefix="pulumi_up-", suffix=".log")[1]))
                print(f"pulumi_up: run {n}: {error} (the CLI's output: {kept})", file=sys.stderr)
                return 1
            log(
                f"run {n}: "
                + ", ".join(f"{s} {runs[-1][s]['seconds']} s" for s in STEPS)
                + f"; passed: {passed(runs[-1])}"
            )
    last = runs[-1]
    result = {
        "when": datetime.now(UTC).strftime("%Y-%m-%dT%H:%MZ"),
        "machine": "2 cores, shared",
        "versions": last["versions"],
        "stack": last["stack"],
        "settings": last["settings"],
        "pulumi_yaml_fixes": last["pulumi_yaml_fixes"],
        "plan": last["plan"],
        "build": last["build"],
        "seconds": {s: [r[s]["seconds"] for r in runs] for s in STEPS},
        "passed": [passed(r) for r in runs],
        "runs": [{k: v for k, v in r.items() if k not in ("versions", "build", "settings")} for r in runs],
    }
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: result[k] for k in ("versions", "seconds", "passed")}, indent=2))
    return 0 if all(result["passed"]) else 1


if __name__ == "__main__":
    sys.exit(main())
