"""Azure Resource Manager over HTTPS, for the jobs an operator runs from their own machine (the
image capture, the roll): requests with a bearer token, long-running operations waited for, and
every refusal one line naming the request and Azure's own code and message.

A long-running operation is followed as Resource Manager asks: the `Azure-AsyncOperation` URL until
its status is terminal, else the `Location` URL until it answers with something other than 202,
else the resource itself until its `provisioningState` is; `Retry-After` sets the pace. Throttling
(429) and server errors (5xx) are retried a few times, at the pace Resource Manager gives."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

ARM = "https://management.azure.com"
COMPUTE_API = "2024-07-01"
"""The Compute API version the jobs speak (VMs, scale sets and their instances)."""
TERMINAL = ("Succeeded", "Failed", "Canceled")
TOKEN_ENV = "AZURE_ACCESS_TOKEN"


class ArmError(RuntimeError):
    """A request Resource Manager refused, or an operation that failed: one line."""


@dataclass
class Answer:
    status: int
    headers: Mapping[str, str]
    body: Any


def cli_token(resource: str = ARM) -> str:
    """An access token for Resource Manager: $AZURE_ACCESS_TOKEN, else the Azure CLI's login."""
    if os.environ.get(TOKEN_ENV):
        return os.environ[TOKEN_ENV]
    az = shutil.which("az")
    if az is None:
        raise ArmError(f"no Azure credentials: log in with the Azure CLI (az login) or set {TOKEN_ENV}")
    command = [az, "account", "get-access-token", "--resource", resource + "/", "--query", "accessToken"]
    proc = subprocess.run([*command, "-o", "tsv"], capture_output=True, text=True, timeout=60)
    if proc.returncode != 0 or not proc.stdout.strip():
        why = (proc.stderr.strip().splitlines() or ["no token"])[-1]
        raise ArmError(f"the Azure CLI gave no token ({why}): run az login, or set {TOKEN_ENV}")
    return proc.stdout.strip()


class Arm:
    """Requests to Resource Manager at `base` (a path names the resource, `api` its API version)."""

    def __init__(
        self,
        token: Callable[[], str] = cli_token,
        base: str = ARM,
        timeout: float = 60.0,
        poll_s: float = 10.0,
        deadline_s: float = 3600.0,
        retries: int = 4,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.base, self.token, self.timeout = base.rstrip("/"), token, timeout
        self.poll_s, self.deadline_s, self.retries = poll_s, deadline_s, retries
        self.sleep, self.clock = sleep, clock
        self._token: str | None = None

    def url(self, path: str, api: str) -> str:
        return f"{self.base}{path}?{urllib.parse.urlencode({'api-version': api})}"

    # --- the verbs -------------------------------------------------------------------------------

    def get(self, path: str, api: str) -> Any:
        """The resource at `path`, or None where Resource Manager has none (404)."""
        answer = self._send("GET", self.url(path, api), None, f"GET {path}", missing_ok=True)
        return None if answer.status == 404 else answer.body

    def list(self, path: str, api: str) -> list[Any]:
        """Every item of a collection, following `nextLink` page after page."""
        items: list[Any] = []
        url: str | None = self.url(path, api)
        while url:
            body = self._send("GET", url, None, f"GET {path}").body or {}
            items.extend(body.get("value") or [])
            url = body.get("nextLink")
        return items

    def put(self, path: str, api: str, body: Mapping[str, Any], what: str) -> Any:
        """Create or replace the resource, and wait until it is provisioned; the resource then."""
        answer = self._send("PUT", self.url(path, api), body, what)
        self._wait(answer, what, resource=(path, api))
        return self.get(path, api)

    def post(self, path: str, api: str, what: str, body: Mapping[str, Any] | None = None) -> Any:
        """An action on the resource (deallocate, generalize), waited for; its result, if any."""
        answer = self._send("POST", self.url(path, api), body, what)
        return self._wait(answer, what)

    def delete(self, path: str, api: str, what: str) -> None:
        """Delete the resource and wait until it is gone (already gone is fine)."""
        answer = self._send("DELETE", self.url(path, api), None, what, missing_ok=True)
        if answer.status != 404:
            self._wait(answer, what)

    # --- long-running operations -----------------------------------------------------------------

    def _wait(self, answer: Answer, what: str, resource: tuple[str, str] | None = None) -> Any:
        until = self.clock() + self.deadline_s
        operation = answer.headers.get("azure-asyncoperation")
        location = answer.headers.get("location")
        if operation:
            while True:
                self._pause(answer, until, what)
                answer = self._send("GET", operation, None, what)
                if (answer.body or {}).get("status") in TERMINAL:
                    break
            body = answer.body or {}
            if body.get("status") != "Succeeded":
                raise ArmError(f"{what}: {body.get('status')}{_detail(body.get('error'))}")
            return body.get("properties")
        if location and answer.status == 202:
            while answer.status == 202:
                self._pause(answer, until, what)
                answer = self._send("GET", location, None, what)
            if resource is None:
                return answer.body
            answer = self._send("GET", self.url(*resource), None, what)  # the resource as it ended
        elif answer.status == 202 and resource is not None:  # accepted, with nowhere to ask: the resource
            answer = self._send("GET", self.url(*resource), None, what)
        if resource is not None and answer.status in (200, 201):
            path, api = resource
            while _state(answer.body) not in (None, *TERMINAL):
                self._pause(answer, until, what)
                answer = self._send("GET", self.url(path, api), None, what)
            if _state(answer.body) in ("Failed", "Canceled"):
                raise ArmError(f"{what}: provisioning {_state(answer.body)}")
        return answer.body

    def _pause(self, answer: Answer, until: float, what: str) -> None:
        if self.clock() > until:
            raise ArmError(f"{what}: not finished after {self.deadline_s:.0f} s")
        # at least a second between polls (a `Retry-After: 0` must not spin for an hour)
        self.sleep(max(_retry_after(answer.headers, self.poll_s), min(self.poll_s, 1.0)))

    # --- one request -----------------------------------------------------------------------------

    def _bearer(self, fresh: bool = False) -> str:
        if self._token is None or fresh:
            self._token = self.token()
        return self._token

    def _send(
        self, method: str, url: str, body: Mapping[str, Any] | None, what: str, missing_ok: bool = False
    ) -> Answer:
        data = json.dumps(body).encode() if body is not None else None
        refreshed = False
        for attempt in range(self.retries + 1):
            headers = {"Authorization": f"Bearer {self._bearer()}", "Accept": "application/json"}
            if data is not None:
                headers["Content-Type"] = "application/json"
            req = urllib.request.Request(url, data=data, method=method, headers=headers)
            try:
                with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                    raw = resp.read()
                    got = {k.lower(): v for k, v in resp.headers.items()}
                    return Answer(resp.status, got, _json(raw, what))
            except urllib.error.HTTPError as exc:
                raw = exc.read()
                got = {k.lower(): v for k, v in exc.headers.items()}
                if exc.code == 404 and missing_ok:
                    return Answer(404, got, None)
                if exc.code == 401 and not refreshed:  # an expired token: one more, once
                    refreshed = True
                    self._bearer(fresh=True)
                    continue
                if (exc.code == 429 or exc.code >= 500) and attempt < self.retries:
                    self.sleep(_retry_after(got, self.poll_s))
                    continue
                raise ArmError(f"{what}: HTTP {exc.code}{_detail(_error_of(raw))}") from None
            except (urllib.error.URLError, OSError) as exc:
                if attempt < self.retries:
                    self.sleep(self.poll_s)
                    continue
                raise ArmError(f"{what}: {getattr(exc, 'reason', exc)}") from None
        raise ArmError(f"{what}: HTTP 401: the access token was refused twice: log in again (az login)")


def _json(raw: bytes, what: str) -> Any:
    if not raw.strip():
        return None
    try:
        return json.loads(raw)
    except ValueError:
        raise ArmError(f"{what}: the answer is not JSON ({raw[:120].decode(errors='replace')!r})") from None


def _state(body: Any) -> str | None:
    return ((body or {}).get("properties") or {}).get("provisioningState")


def _retry_after(headers: Mapping[str, str], default: float) -> float:
    try:
        return max(0.0, min(float(headers.get("retry-after", default)), 120.0))
    except ValueError:
        return default


def _error_of(raw: bytes) -> Any:
    try:
        return (json.loads(raw) or {}).get("error")
    except (ValueError, AttributeError):
        return {"message": raw[:300].decode(errors="replace").strip()}


def _detail(error: Any) -> str:
    """Azure's error object as `: Code: message` (empty when there is none)."""
    if not isinstance(error, Mapping):
        return ""
    code, message = error.get("code"), " ".join(str(error.get("message") or "").split())
    return f": {code}: {message}" if code else (f": {message}" if message else "")
