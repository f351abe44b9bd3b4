"""The lab's Azure Instance Metadata Service: each lab host's `/metadata/instance` at 169.254.169.254.

Azure answers a VM's metadata requests from the host it runs on and knows the VM by its NIC; the lab
does the same from its switch namespace, where one server knows each host by the source address
of the request (the host's own IP or any of its NIC's secondary IPs, as a pod's request would come).
Documents follow Azure's documented shape for api-version 2021-02-01 (the parts nodes read:
`compute` with `tagsList`, `network.interface[].ipv4.ipAddress[].privateIpAddress` and `subnet`)
and are built by `superkube.lab.fabric` from the plan's scale-set NIC IP configurations and tags.

As Azure does, the server refuses a request without the `Metadata: true` header, without an
`api-version`, or with an `X-Forwarded-For` header, with HTTP 400 and an `error` message.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from ipaddress import IPv4Network
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

ADDRESS = "169.254.169.254"
PORT = 80
ROOT = "/metadata/instance"


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


def answer(doc: dict[str, Any] | None, path: str, headers: dict[str, str]) -> tuple[int, Any]:
    """(HTTP status, JSON body) for a GET of `path` (with its query) from the host owning `doc`."""
    parts = urlsplit(path)
    lower = {k.lower(): v for k, v in headers.items()}
    if "x-forwarded-for" in lower:
        return 400, {"error": "Bad request. The request cannot contain the X-Forwarded-For header"}
    if lower.get("metadata", "").lower() != "true":
        return 400, {"error": "Bad request. Required metadata header not specified"}
    if not parse_qs(parts.query).get("api-version"):
        return 400, {"error": "Bad request. api-version was not specified in the request"}
    if doc is None:
        return 404, {"error": "Not found. No VM is known by the request's source address"}
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


def handler(lookup: Callable[[str], dict[str, Any] | None]) -> type[BaseHTTPRequestHandler]:
    """A request handler answering each request from `lookup(source address)`'s document."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            status, body = answer(lookup(self.client_address[0]), self.path, dict(self.headers))
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
    with ThreadingHTTPServer((address, port), handler(Documents(documents).lookup)) as server:
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
