"""The lab's Azure Instance Metadata Service: each lab host's `/metadata/instance` at 169.254.169.254.

Azure answers a VM's metadata requests from the host it runs on and knows the VM by its NIC; the lab
does the same from its switch namespace, where one server knows each host by the source address
of the request (the host's own IP or any of its NIC's secondary IPs, as a pod's request would come).
Documents follow Azure's documented shape for api-version 2021-02-01 (the parts nodes read:
`compute` with `tagsList`, `network.interface[].ipv4.ipAddress[].privateIpAddress` and `subnet`)
and are built by `superkube.lab.fabric` from the plan's scale-set NIC IP configurations and tags.

As Azure does, the server refuses a request without the `Metadata: true` header, without an
`api-version`, or with an `X-Forwarded-For` header, with HTTP 400 and an `error` message.

It also serves each host's Scheduled Events (`/metadata/scheduledevents`, GET, and POST with
`StartRequests` to approve) in Azure's document format (superkube.agents.scheduled_events says
which); the events come from a second file, EVENTS beside the documents, which `superkube lab
fault HOST scheduled-event` writes (`add_event`). As on Azure, an approved event is `Started` with an
empty NotBefore and the document's incarnation grows with every change; the lab also records when
it was approved (`approved_at`, a key Azure does not serve) so a test can hold the approval to
before NotBefore.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from ipaddress import IPv4Network
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

ADDRESS = "169.254.169.254"
PORT = 80
ROOT = "/metadata/instance"
SCHEDULED = "/metadata/scheduledevents"
EVENTS = "scheduledevents.json"  # beside the documents: host -> {"incarnation": n, "events": [...]}
EVENT_TYPES = ("Reboot", "Redeploy", "Terminate", "Freeze", "Preempt")
LAB_ONLY = ("approved_at",)  # kept with an event, never served
_lock = threading.Lock()


def document(
    *,
    name: str,
    scale_set: str,
    location: str,
    vm_size: str,
    tags: dict[str, str],
    primary: str,
    secondary: list[str],
    prefixlen: int,
    mac: str,
) -> dict[str, Any]:
    """One VM's `/metadata/instance` document."""
    subnet = IPv4Network((primary, prefixlen), strict=False)
    return {
        "compute": {
            "name": name,
            "vmScaleSetName": scale_set,
            "location": location,
            "vmSize": vm_size,
            "osType": "Linux",
            "tags": ";".join(f"{k}:{v}" for k, v in sorted(tags.items())),
            "tagsList": [{"name": k, "value": v} for k, v in sorted(tags.items())],
        },
        "network": {
            "interface": [
                {
                    "ipv4": {
                        "ipAddress": [
                            {"privateIpAddress": ip, "publicIpAddress": ""} for ip in [primary, *secondary]
                        ],
                        "subnet": [{"address": str(subnet.network_address), "prefix": str(prefixlen)}],
                    },
                    "ipv6": {"ipAddress": []},
                    "macAddress": mac.replace(":", "").upper(),
                }
            ]
        },
    }


def by_source(documents: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Every address a host's requests may come from -> that host's document."""
    out: dict[str, dict[str, Any]] = {}
    for doc in documents.values():
        for entry in doc["network"]["interface"][0]["ipv4"]["ipAddress"]:
            out[entry["privateIpAddress"]] = doc
    return out


def _refused(doc: dict[str, Any] | None, path: str, headers: dict[str, str]) -> tuple[int, Any] | None:
    """Azure's answer to a request it refuses whatever the path, or None."""
    lower = {k.lower(): v for k, v in headers.items()}
    if "x-forwarded-for" in lower:
        return 400, {"error": "Bad request. The request cannot contain the X-Forwarded-For header"}
    if lower.get("metadata", "").lower() != "true":
        return 400, {"error": "Bad request. Required metadata header not specified"}
    if not parse_qs(urlsplit(path).query).get("api-version"):
        return 400, {"error": "Bad request. api-version was not specified in the request"}
    if doc is None:
        return 404, {"error": "Not found. No VM is known by the request's source address"}
    return None


# --- scheduled events ---------------------------------------------------------------------------


def _read_events(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return {}


def _write_events(path: Path, data: dict[str, Any]) -> None:
    part = path.with_name(path.name + ".part")
    part.write_text(json.dumps(data, indent=2))
    part.replace(path)  # whole, so the server never reads half


def events_document(path: Path, host: str) -> dict[str, Any]:
    """The host's `/metadata/scheduledevents` document, as Azure serves it."""
    mine = _read_events(path).get(host) or {}
    served = [{k: v for k, v in e.items() if k not in LAB_ONLY} for e in mine.get("events", [])]
    return {"DocumentIncarnation": mine.get("incarnation", 0), "Events": served}


def events_of(path: Path, host: str) -> list[dict[str, Any]]:
    """The host's events with the lab's own keys (when each was approved)."""
    return list((_read_events(path).get(host) or {}).get("events", []))


def add_event(
    path: Path, host: str, vm: str, kind: str, not_before_s: float, *, duration_s: int = -1,
    at: datetime | None = None, source: str = "Platform",
) -> dict[str, Any]:  # fmt: skip
    """Schedule `kind` for the host's VM `vm`, `not_before_s` seconds from `at` (now)."""
    if kind not in EVENT_TYPES:
        raise ValueError(f"event type {kind!r}: one of {', '.join(EVENT_TYPES)}")
    when = (at or datetime.now(UTC)) + timedelta(seconds=not_before_s)
    event = {
        "EventId": str(uuid.uuid4()).upper(),
        "EventType": kind,
        "ResourceType": "VirtualMachine",
        "Resources": [vm],
        "EventStatus": "Scheduled",
        "NotBefore": format_datetime(when, usegmt=True),
        "Description": f"lab: {kind} scheduled by superkube lab fault",
        "EventSource": source,
        "DurationInSeconds": duration_s,
    }
    with _lock:
        data = _read_events(path)
        mine = data.setdefault(host, {"incarnation": 0, "events": []})
        mine["events"].append(event)
        mine["incarnation"] += 1
        _write_events(path, data)
    return event


def clear_events(path: Path, host: str) -> int:
    """Remove the host's events (as Azure does once they are over); how many there were."""
    with _lock:
        data = _read_events(path)
        mine = data.get(host) or {"incarnation": 0, "events": []}
        gone = len(mine["events"])
        if gone:
            data[host] = {"incarnation": mine["incarnation"] + 1, "events": []}
            _write_events(path, data)
    return gone


def approve(path: Path, host: str, body: Any, at: datetime | None = None) -> tuple[int, Any]:
    """A POST of StartRequests from `host`: its Scheduled events named there become Started."""
    requests = body.get("StartRequests") if isinstance(body, dict) else None
    if not isinstance(requests, list) or not all(isinstance(r, dict) and "EventId" in r for r in requests):
        return 400, {"error": 'Bad request. The body must be {"StartRequests": [{"EventId": ...}]}'}
    ids = {str(r["EventId"]) for r in requests}
    stamp = (at or datetime.now(UTC)).isoformat()
    with _lock:
        data = _read_events(path)
        mine = data.get(host) or {"incarnation": 0, "events": []}
        changed = False
        for e in mine["events"]:
            if e["EventId"] in ids and e["EventStatus"] == "Scheduled":
                e.update(EventStatus="Started", NotBefore="", approved_at=stamp)
                changed = True
        if changed:
            mine["incarnation"] += 1
            data[host] = mine
            _write_events(path, data)
    return 200, {}


def answer(
    doc: dict[str, Any] | None, path: str, headers: dict[str, str], events: Path | None = None
) -> tuple[int, Any]:
    """(HTTP status, JSON body) for a GET of `path` (with its query) from the host owning `doc`."""
    parts = urlsplit(path)
    refused = _refused(doc, path, headers)
    if refused is not None or doc is None:
        return refused or (404, {})
    if parts.path.rstrip("/") == SCHEDULED:
        if events is None:
            return 404, {"error": "Not found"}
        return 200, events_document(events, doc["compute"]["name"])
    if parts.path.rstrip("/") != ROOT and not parts.path.startswith(ROOT + "/"):
        return 404, {"error": "Not found"}
    value: Any = doc
    for key in filter(None, parts.path[len(ROOT) :].split("/")):
        if isinstance(value, dict) and key in value:
            value = value[key]
        elif isinstance(value, list) and key.isdigit() and int(key) < len(value):
            value = value[int(key)]
        else:
            return 404, {"error": "Not found"}
    return 200, value


def handler(
    lookup: Callable[[str], dict[str, Any] | None], events: Path | None = None
) -> type[BaseHTTPRequestHandler]:
    """A request handler answering each request from `lookup(source address)`'s document."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self._send(*answer(lookup(self.client_address[0]), self.path, dict(self.headers), events))

        def do_POST(self) -> None:
            doc = lookup(self.client_address[0])
            refused = _refused(doc, self.path, dict(self.headers))
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            if refused is not None or doc is None:
                self._send(*(refused or (404, {})))
            elif urlsplit(self.path).path.rstrip("/") != SCHEDULED or events is None:
                self._send(404, {"error": "Not found"})
            else:
                try:
                    body = json.loads(raw or b"null")
                except ValueError:
                    body = None
                self._send(*approve(events, doc["compute"]["name"], body))

        def _send(self, status: int, body: Any) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json; charset=utf-8")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            sys.stderr.write(f"imds {self.client_address[0]} {format % args}\n")

    return Handler


class Documents:
    """The documents file, read again whenever it changes: `lab scale` adds instances to a running
    lab, as Azure's metadata service knows a VM from its first boot."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.stamp: tuple[int, int] | None = None  # (inode, mtime): each write replaces the file whole
        self.sources: dict[str, dict[str, Any]] = {}

    def lookup(self, source: str) -> dict[str, Any] | None:
        seen = self.path.stat()
        stamp = (seen.st_ino, seen.st_mtime_ns)
        if stamp != self.stamp:
            self.sources, self.stamp = by_source(json.loads(self.path.read_text())), stamp
        return self.sources.get(source)


def serve(documents: Path, address: str = ADDRESS, port: int = PORT) -> None:
    ThreadingHTTPServer.allow_reuse_address = True
    events = documents.with_name(EVENTS)
    with ThreadingHTTPServer((address, port), handler(Documents(documents).lookup, events)) as server:
        server.serve_forever()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m superkube.lab.imds", description=__doc__.splitlines()[0])
    parser.add_argument("documents", type=Path, help="JSON: host name -> /metadata/instance document")
    parser.add_argument("--address", default=ADDRESS)
    parser.add_argument("--port", type=int, default=PORT)
    args = parser.parse_args(argv)
    json.loads(args.documents.read_text())  # a broken file fails here, at start
    serve(args.documents, args.address, args.port)
    return 0


if __name__ == "__main__":
    sys.exit(main())
