"""Team webhook: a mutating admission webhook that holds every pod to its namespace's team.

A pod's team is its namespace's: the namespace label `superkube.io/team`, which only cluster admins
can set (namespaces are cluster-scoped; a team's own roles cannot relabel one). The API server tells
the webhook which team that is by the path it calls: the webhook configuration has one entry per
team, `/mutate/<team>`, selecting that team's namespaces, and one, `/mutate`, for every other
namespace outside the system ones. So every pod outside kube-system and superkube's namespace
passes here, and the webhook reads no namespace itself.

For a Pod CREATE:
- a pod of team T gets the toleration `superkube.io/team=T`, and `superkube.io/team=any` when it
  opts into borrowing with `superkube.io/borrow: "true"`, and the label `superkube.io/team=T`;
- a pod of no team gets no team toleration: it runs only on nodes no team owns (said as a warning);
- refused (403, one line saying what to change): a toleration that reaches team nodes the pod is
  not owed (another team's, or a key-less `Exists`), a `superkube.io/team` label other than its
  namespace's team, a borrow label other than "true"/"false", borrowing by a pod of no team, a
  `spec.nodeName` set at creation (only the scheduler holds NoSchedule taints; mirror pods, made by
  kubelets, pass). A namespace labelled with a team the configuration does not name has no entry
  of its own: its pods are asked about as pods of no team.
For a Pod UPDATE: refused if it adds a toleration the pod is not owed (tolerations can be added to
a pending pod) or changes the team label; anything else passes unchanged.
Nothing else in the pod is touched: Kueue's labels, annotations, scheduling gates and node
selectors stay as they are, so the two can run side by side.

Every answer is an AdmissionReview, never a server error:
- not JSON, or not an AdmissionReview: denied, code 400, saying which;
- not a Pod, or neither CREATE nor UPDATE: allowed, unchanged (with a warning when not a Pod);
- the configuration unreadable: denied, 503, naming the file (the pod's controller retries).

The configuration is the mounted teams ConfigMap, reread when its file changes.

Metrics, on a plain-HTTP port of their own (`--metrics-port`, default TEAM_WEBHOOK_METRICS_PORT):
`superkube_team_webhook_admissions_total{decision, code}` (allowed 200; denied 400 for a review it
cannot read, 403 for a pod the team rules refuse, 503 while the configuration cannot be used) and
`superkube_team_webhook_admission_duration_seconds` (a histogram of the time to answer a review).

Run: python -m superkube.agents.team_webhook --config teams.yaml --cert tls.crt --key tls.key
"""

from __future__ import annotations

import argparse
import base64
import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram

from superkube.cluster.kube import TEAM_WEBHOOK_METRICS_PORT, TEAM_WEBHOOK_PORT
from superkube.model import teams

COMPONENT = "superkube-team-webhook"
REVIEW_API = "admission.k8s.io/v1"
log = logging.getLogger(COMPONENT)


class Config:
    """The teams file, reloaded when its modification time or size changes."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._seen: tuple[int, int] | None = None
        self._teams: frozenset[str] = frozenset()
        self.error: str | None = None

    def teams(self) -> frozenset[str]:
        try:
            st = os.stat(self.path)
        except OSError as e:
            self.error = f"{self.path}: cannot read: {e.strerror}"
            return frozenset()
        key = (st.st_mtime_ns, st.st_size)
        if key != self._seen:
            try:
                self._teams = frozenset(t.team for t in teams.load_file(self.path)) - {teams.ANY}
                self.error = None
            except teams.TeamsError as e:
                self.error = str(e)
                self._teams = frozenset()
            self._seen = key
        return self._teams


class Metrics:
    """Every answer by its decision and code, and how long answering took."""

    ANSWERS = (("allowed", "200"), ("denied", "400"), ("denied", "403"), ("denied", "503"))
    # the API server waits at most the configuration's timeout (1-30 s, 5 by default)
    BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.admissions = Counter("superkube_team_webhook_admissions",
                                  "Admission reviews answered, by decision (allowed, denied) and code.",
                                  ["decision", "code"], registry=self.registry)  # fmt: skip
        self.latency = Histogram("superkube_team_webhook_admission_duration_seconds",
                                 "Seconds from a review's body read to its answer.", buckets=self.BUCKETS,
                                 registry=self.registry)  # fmt: skip
        for decision, code in self.ANSWERS:  # every series from the start, so the first denial counts
            self.admissions.labels(decision, code)

    def answered(self, answer: dict[str, Any], seconds: float) -> None:
        response = answer["response"]
        code = (response.get("status") or {}).get("code", 200)
        self.admissions.labels("allowed" if response["allowed"] else "denied", str(code)).inc()
        self.latency.observe(seconds)

    def value(self, name: str, **labels: str) -> float | None:
        """A sample's value now (None when there is none)."""
        return self.registry.get_sample_value(name, labels)


def _answer(
    uid: str,
    allowed: bool,
    *,
    code: int = 200,
    message: str = "",
    patch: list[Any] | None = None,
    warnings: list[str] | None = None,
) -> dict[str, Any]:
    response: dict[str, Any] = {"uid": uid, "allowed": allowed}
    if message or not allowed:
        response["status"] = {"code": code, "message": message}
    if patch:
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(json.dumps(patch).encode()).decode()
    if warnings:
        response["warnings"] = warnings
    return {"apiVersion": REVIEW_API, "kind": "AdmissionReview", "response": response}


def review(body: bytes, config: Config, namespace_team: str | None = None) -> dict[str, Any]:
    """The AdmissionReview answering one request body, for a pod whose namespace belongs to
    `namespace_team` (None: to no team). The API server says which: it calls `/mutate/<team>` for
    the namespaces labelled with that team and `/mutate` for the others (the webhook
    configuration's namespace selectors), so the webhook reads no namespace itself."""
    try:
        doc = json.loads(body)
    except (ValueError, UnicodeDecodeError) as e:
        return _answer("", False, code=400, message=f"{COMPONENT}: the request body is not JSON ({e})")
    request = doc.get("request") if isinstance(doc, dict) else None
    if (
        not isinstance(doc, dict)
        or doc.get("apiVersion") != REVIEW_API
        or doc.get("kind") != "AdmissionReview"
        or not isinstance(request, dict)
    ):
        return _answer(
            str(request.get("uid", "")) if isinstance(request, dict) else "",
            False,
            code=400,
            message=f"{COMPONENT}: expected an {REVIEW_API} AdmissionReview with a request",
        )
    uid = str(request.get("uid", ""))
    kind = (request.get("kind") or {}).get("kind") if isinstance(request.get("kind"), dict) else None
    if kind != "Pod" or request.get("subResource"):
        return _answer(
            uid, True, warnings=[f"{COMPONENT} changes Pods only; this {kind or 'object'} is left as it is"]
        )
    operation = request.get("operation")
    if operation not in ("CREATE", "UPDATE"):
        return _answer(uid, True)
    pod = request.get("object")
    if not isinstance(pod, dict):
        return _answer(uid, False, code=400, message=f"{COMPONENT}: the review's request has no Pod object")
    meta = pod.get("metadata") or {}
    labels = meta.get("labels") or {}
    name = meta.get("name") or meta.get("generateName") or "pod"
    where = f"{request.get('namespace') or meta.get('namespace') or '?'}/{name}"
    spec = pod.get("spec") or {}
    if operation == "UPDATE":
        old_object = request.get("oldObject")
        old: dict[str, Any] = old_object if isinstance(old_object, dict) else {}
        return _decide_update(uid, where, old, labels, spec, namespace_team, config)
    user = str((request.get("userInfo") or {}).get("username", ""))
    if spec.get("nodeName") and not user.startswith("system:node:"):
        # a pod bound at creation skips the scheduler, the only thing that holds NoSchedule taints
        return _answer(
            uid,
            False,
            code=403,
            message=f"{where}: spec.nodeName is set ({spec['nodeName']}); outside the system namespaces pods are "
            "placed by the scheduler, which holds team taints: use a nodeSelector or affinity instead",
        )
    return _decide(uid, where, labels, spec, namespace_team, config)


def _unowed(
    uid: str, where: str, tolerations: list[Any], owed: list[Any], team: str | None, hint: str = ""
) -> dict[str, Any] | None:
    """The refusal for the first of `tolerations` that reaches team nodes the pod is not owed, if any."""
    unowed = [t for t in tolerations if teams.reaches_team_nodes(t) and not _is_one_of(t, owed)]
    if not unowed:
        return None
    whose = f"team {team!r}" if team else "no team"
    return _answer(
        uid,
        False,
        code=403,
        message=f"{where}: toleration {json.dumps(unowed[0], sort_keys=True)} reaches nodes its namespace's "
        f"{whose} does not own; remove it{hint}",
    )


def _decide_update(
    uid: str,
    where: str,
    old: dict[str, Any],
    labels: dict[str, Any],
    spec: dict[str, Any],
    team: str | None,
    config: Config,
) -> dict[str, Any]:
    """An update may not add what a creation could not have: a toleration of nodes the pod is not
    owed (tolerations may be added to a pending pod), or another team label."""
    old_labels = (old.get("metadata") or {}).get("labels") or {}
    if labels.get(teams.TEAM_KEY) != old_labels.get(teams.TEAM_KEY):
        return _answer(
            uid,
            False,
            code=403,
            message=f"{where}: the {teams.TEAM_KEY} label may not change after creation; create a new pod",
        )
    had = list((old.get("spec") or {}).get("tolerations") or [])
    added = [t for t in spec.get("tolerations") or [] if not _is_one_of(t, had)]
    borrow = labels.get(teams.BORROW_LABEL, "false") == "true"
    owed = teams.tolerations_for(team, borrow) if team and team in config.teams() else []
    return _unowed(uid, where, added, owed, team) or _answer(uid, True)


def _decide(
    uid: str,
    where: str,
    labels: dict[str, Any],
    spec: dict[str, Any],
    team: str | None,
    config: Config,
) -> dict[str, Any]:
    """The answer for one pod of namespace team `team` (None: a namespace of no team)."""
    known = config.teams()
    if config.error:
        return _answer(
            uid,
            False,
            code=503,
            message=f"{COMPONENT}: the team configuration cannot be used: {config.error}",
        )
    if team is not None and team not in known:
        return _answer(
            uid,
            False,
            code=403,
            message=f"{where}: its namespace's team {team!r} ({teams.TEAM_KEY}) is not in the team capacity "
            f"configuration (teams: {', '.join(sorted(known)) or 'none'}); fix the namespace's label or add "
            "the team's tuples",
        )
    claimed = labels.get(teams.TEAM_KEY)
    if claimed is not None and claimed != team:
        owner = f"team {team!r}" if team else "no team"
        return _answer(
            uid,
            False,
            code=403,
            message=f"{where}: labelled {teams.TEAM_KEY}={claimed} but its namespace belongs to {owner}; a pod's "
            f"team is its namespace's (the namespace label {teams.TEAM_KEY}, set by cluster admins): drop the label",
        )
    borrow = labels.get(teams.BORROW_LABEL, "false")
    if borrow not in ("true", "false"):
        return _answer(
            uid,
            False,
            code=403,
            message=f'{where}: {teams.BORROW_LABEL} is {borrow!r}; write "true" or "false"',
        )
    if team is None and borrow == "true":
        return _answer(
            uid,
            False,
            code=403,
            message=f"{where}: {teams.BORROW_LABEL}=true, but its namespace belongs to no team and only a team's "
            "pods may borrow; run it in a team's namespace or drop the label",
        )
    had = list(spec.get("tolerations") or [])
    owed = teams.tolerations_for(team, borrow == "true") if team else []
    refused = _unowed(uid, where, had, owed, team, " (the webhook adds the team tolerations a pod is owed)")
    if refused:
        return refused
    want = had + [t for t in owed if not _is_one_of(t, had)]
    patch: list[dict[str, Any]] = []
    if want != had:
        patch.append(
            {"op": "replace" if "tolerations" in spec else "add", "path": "/spec/tolerations", "value": want}
        )
    if team and claimed is None:  # the pod says its team, for those who read pods (jobs, quotas, metrics)
        if labels:
            patch.append(
                {"op": "add", "path": f"/metadata/labels/{teams.TEAM_KEY.replace('/', '~1')}", "value": team}
            )
        else:
            patch.append({"op": "add", "path": "/metadata/labels", "value": {teams.TEAM_KEY: team}})
    if team is None:
        return _answer(uid, True, patch=patch, warnings=[f"{where}: its namespace belongs to no team, so it "
                                                          "runs only on nodes no team owns"])  # fmt: skip
    return _answer(uid, True, patch=patch)


def _is_one_of(tol: dict[str, Any], tols: list[dict[str, Any]]) -> bool:
    """The same toleration (an omitted operator is Equal)."""
    norm = {**tol, "operator": tol.get("operator") or "Equal"}
    return any(norm == {**t, "operator": t.get("operator") or "Equal"} for t in tols)


def app(config_path: Path, metrics: Metrics | None = None) -> Any:
    """The ASGI application: POST /mutate, GET /healthz; each answer counted in `metrics`."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, PlainTextResponse
    from starlette.routing import Route

    config = Config(config_path)
    config.teams()
    counted = metrics or Metrics()

    async def mutate(request: Request) -> JSONResponse:
        body = await request.body()
        team = request.path_params.get("team")
        started = time.perf_counter()
        try:
            answer = review(body, config, team)
        except Exception:  # a bug: still an answer the API server can act on, and a log line
            log.exception("review failed")
            answer = _answer("", False, code=400, message=f"{COMPONENT}: could not review this request")
        counted.answered(answer, time.perf_counter() - started)
        resp = answer["response"]
        if not resp["allowed"]:
            log.info("denied %s: %s", resp.get("uid", ""), resp["status"]["message"])
        return JSONResponse(answer)

    async def healthz(request: Request) -> PlainTextResponse:
        config.teams()
        return PlainTextResponse(
            "ok" if config.error is None else config.error, status_code=200 if config.error is None else 503
        )

    return Starlette(
        routes=[
            Route("/mutate", mutate, methods=["POST"]),
            Route("/mutate/{team}", mutate, methods=["POST"]),
            Route("/healthz", healthz),
        ]
    )


def _args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="team_webhook", description=(__doc__ or "").splitlines()[0])
    p.add_argument("--config", type=Path, required=True, help="the teams file (the mounted ConfigMap)")
    p.add_argument("--cert", type=Path, required=True, help="serving certificate (PEM)")
    p.add_argument("--key", type=Path, required=True, help="its private key (PEM)")
    p.add_argument("--address", default="0.0.0.0")
    p.add_argument("--port", type=int, default=TEAM_WEBHOOK_PORT)
    p.add_argument("--metrics-port", type=int, default=TEAM_WEBHOOK_METRICS_PORT, help="plain-HTTP /metrics")
    p.add_argument("--metrics-address", default="0.0.0.0")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    import ssl

    import uvicorn
    from prometheus_client import start_http_server

    args = _args(argv)
    logging.basicConfig(
        level=logging.INFO, format=f"{COMPONENT} %(levelname)s %(message)s", stream=sys.stderr
    )
    for what, path in (("--cert", args.cert), ("--key", args.key)):
        if not path.is_file():
            print(f"{COMPONENT}: {what} {path}: no such file", file=sys.stderr)
            return 2
    try:
        ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(args.cert, args.key)
    except (ssl.SSLError, ValueError) as e:
        print(
            f"{COMPONENT}: {args.cert} and {args.key} are not a certificate and its key ({e})",
            file=sys.stderr,
        )
        return 2
    metrics = Metrics()
    try:
        start_http_server(args.metrics_port, addr=args.metrics_address, registry=metrics.registry)
    except OSError as e:
        print(
            f"{COMPONENT}: cannot serve metrics on {args.metrics_address}:{args.metrics_port}: {e}",
            file=sys.stderr,
        )
        return 1
    uvicorn.run(
        app(args.config, metrics),
        host=args.address,
        port=args.port,
        ssl_certfile=str(args.cert),
        ssl_keyfile=str(args.key),
        log_level="warning",
        access_log=False,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
