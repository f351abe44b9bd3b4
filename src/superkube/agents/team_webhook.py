"""Team webhook: a mutating admission webhook that gives each pod exactly the team tolerations it is
owed, from its `superkube.io/team` label.

For a Pod CREATE it answers an `admission.k8s.io/v1` AdmissionReview with a JSONPatch that sets the
pod's tolerations to: the ones it had, less any that would reach team nodes it is not owed (the team
key with another value or `Exists`, or a key-less `Exists`), plus `superkube.io/team=<its team>`, plus
`superkube.io/team=any` when it opts into borrowing with `superkube.io/borrow: "true"`. Nothing else
in the pod is touched: Kueue's labels, annotations, scheduling gates and node selectors stay as they
are, so the two can run side by side.

Every answer is an AdmissionReview, never a server error:
- not JSON, or not an AdmissionReview: denied, code 400, saying which;
- not a Pod, or not a CREATE: allowed, unchanged, with a warning;
- no team label: allowed, unchanged, with a warning (it then runs only on nodes no team owns);
- a team the configuration does not name, or a borrow label other than "true"/"false": denied, 403;
- the configuration unreadable: denied, 503, naming the file (the pod's controller retries).

The configuration is the mounted teams ConfigMap, reread when its file changes.

Run: python -m superkube.agents.team_webhook --config teams.yaml --cert tls.crt --key tls.key
"""

from __future__ import annotations

import argparse
import base64
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

from superkube.cluster.kube import TEAM_WEBHOOK_PORT
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


def review(body: bytes, config: Config) -> dict[str, Any]:
    """The AdmissionReview answering one request body."""
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
    if request.get("operation") != "CREATE":
        return _answer(uid, True)
    pod = request.get("object")
    if not isinstance(pod, dict):
        return _answer(uid, False, code=400, message=f"{COMPONENT}: the review's request has no Pod object")
    labels = (pod.get("metadata") or {}).get("labels") or {}
    name = (pod.get("metadata") or {}).get("name") or (pod.get("metadata") or {}).get("generateName") or "pod"
    team = labels.get(teams.TEAM_KEY)
    if not team:
        return _answer(
            uid,
            True,
            warnings=[
                f"{name} has no {teams.TEAM_KEY} label: no team tolerations added, so it runs only on nodes "
                "no team owns; label it with its team to use the team's nodes"
            ],
        )
    known = config.teams()
    if config.error:
        return _answer(
            uid,
            False,
            code=503,
            message=f"{COMPONENT}: the team configuration cannot be used: {config.error}",
        )
    if team != teams.ANY and team not in known:
        return _answer(
            uid,
            False,
            code=403,
            message=f"{name}: team {team!r} ({teams.TEAM_KEY}) is not in the team capacity configuration "
            f"(teams: {', '.join(sorted(known)) or 'none'}); fix the label or add the team's tuples",
        )
    borrow = labels.get(teams.BORROW_LABEL, "false")
    if borrow not in ("true", "false"):
        return _answer(
            uid,
            False,
            code=403,
            message=f'{name}: {teams.BORROW_LABEL} is {borrow!r}; write "true" or "false"',
        )
    spec = pod.get("spec") or {}
    had = list(spec.get("tolerations") or [])
    dropped = [t for t in had if teams.reaches_team_nodes(t)]
    want = [t for t in had if not teams.reaches_team_nodes(t)] + teams.tolerations_for(team, borrow == "true")
    if want == had:
        return _answer(uid, True)
    op = "replace" if "tolerations" in spec else "add"
    warnings = [
        f"{name}: removed toleration {json.dumps(t, sort_keys=True)}: it would reach other teams' nodes"
        for t in dropped
    ]
    return _answer(
        uid, True, patch=[{"op": op, "path": "/spec/tolerations", "value": want}], warnings=warnings
    )


def app(config_path: Path) -> Any:
    """The ASGI application: POST /mutate, GET /healthz."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, PlainTextResponse
    from starlette.routing import Route

    config = Config(config_path)
    config.teams()

    async def mutate(request: Request) -> JSONResponse:
        body = await request.body()
        try:
            answer = review(body, config)
        except Exception:  # a bug: still an answer the API server can act on, and a log line
            log.exception("review failed")
            answer = _answer("", False, code=400, message=f"{COMPONENT}: could not review this request")
        resp = answer["response"]
        if not resp["allowed"]:
            log.info("denied %s: %s", resp.get("uid", ""), resp["status"]["message"])
        return JSONResponse(answer)

    async def healthz(request: Request) -> PlainTextResponse:
        config.teams()
        return PlainTextResponse(
            "ok" if config.error is None else config.error, status_code=200 if config.error is None else 503
        )

    return Starlette(routes=[Route("/mutate", mutate, methods=["POST"]), Route("/healthz", healthz)])


def _args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="team_webhook", description=(__doc__ or "").splitlines()[0])
    p.add_argument("--config", type=Path, required=True, help="the teams file (the mounted ConfigMap)")
    p.add_argument("--cert", type=Path, required=True, help="serving certificate (PEM)")
    p.add_argument("--key", type=Path, required=True, help="its private key (PEM)")
    p.add_argument("--address", default="0.0.0.0")
    p.add_argument("--port", type=int, default=TEAM_WEBHOOK_PORT)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    import ssl

    import uvicorn

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
    uvicorn.run(
        app(args.config),
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
