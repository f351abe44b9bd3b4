"""A loopback stand-in for the few API calls the GPU agents make, for the tests that need what the
real server cannot be made to give on cue: an agent's process run against canned nodes and pods, a
budget's 429 for a named pod. It records each request and answers as the API documents (the
objects it was given, 201 for creations, 429 for an eviction a PodDisruptionBudget refuses).
Whatever depends on how the server applies a change runs against the real API server instead
(tests/agents/conftest.py)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import yaml


class Api:
    """A loopback endpoint for the calls the agent makes: reads answer with the objects given, every
    write is recorded; evictions named in `refuse` get the API's 429 (a PodDisruptionBudget)."""

    def __init__(self, nodes: list[dict[str, Any]], pods: list[dict[str, Any]], refuse: set[str]) -> None:
        self.nodes = {n["metadata"]["name"]: n for n in nodes}
        self.pods, self.refuse = pods, refuse
        self.writes: list[tuple[str, str, str, dict[str, Any]]] = []
        self.reads: list[str] = []
        self.closed = threading.Event()
        api = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _send(self, code: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                api.reads.append(self.path)
                path = self.path.split("?")[0]
                if "watch=" in self.path:  # a watch that sees no change until the server goes
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.end_headers()
                    self.wfile.flush()
                    api.closed.wait()
                    return
                if path == "/api/v1/nodes":
                    self._send(
                        200,
                        {
                            "apiVersion": "v1",
                            "kind": "NodeList",
                            "metadata": {"resourceVersion": "1"},
                            "items": list(api.nodes.values()),
                        },
                    )
                elif path.startswith("/api/v1/nodes/"):
                    self._send(200, api.nodes[path.rsplit("/", 1)[1]])
                elif path == "/api/v1/pods":
                    self._send(
                        200, {"apiVersion": "v1", "kind": "PodList", "metadata": {}, "items": api.pods}
                    )
                else:
                    self._send(404, {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 404})

            def _write(self, method: str) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])) or b"{}")
                api.writes.append((method, self.path, self.headers.get("Content-Type", ""), body))
                if self.path.endswith("/eviction") and body["metadata"]["name"] in api.refuse:
                    self._send(
                        429,
                        {
                            "kind": "Status",
                            "apiVersion": "v1",
                            "status": "Failure",
                            "code": 429,
                            "reason": "TooManyRequests",
                            "message": "Cannot evict pod as it would violate the pod's disruption budget.",
                        },
                    )
                elif method == "PATCH":
                    self._send(200, api.nodes[self.path.rsplit("/", 1)[1]])
                elif self.path.endswith("/eviction"):
                    self._send(201, {"kind": "Status", "apiVersion": "v1", "status": "Success", "code": 201})
                else:
                    self._send(201, body)

            def do_POST(self) -> None:
                self._write("POST")

            def do_PATCH(self) -> None:
                self._write("PATCH")

        self.server = _Server(("127.0.0.1", 0), Handler, self.closed)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def kubeconfig(self, path: Path) -> Path:
        path.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [{"name": "c", "cluster": {"server": f"http://127.0.0.1:{self.port}"}}],
                    "users": [{"name": "u", "user": {"token": "t"}}],
                    "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                    "current-context": "x",
                }
            )
        )
        return path


class _Server(ThreadingHTTPServer):
    """Its open watches end when it shuts down."""

    def __init__(self, address: tuple[str, int], handler: Any, closed: threading.Event) -> None:
        super().__init__(address, handler)
        self.closed = closed

    def shutdown(self) -> None:
        self.closed.set()
        super().shutdown()
