"""A loopback Azure Resource Manager for the operator jobs' tests (no Azure can be reached here).

It holds resources by path and keeps the rules Resource Manager enforces that the jobs depend on,
as Azure documents them, so a job that takes a step out of order fails here as it would there:
- every request needs `api-version` and the bearer token it was given (401 otherwise);
- a VM's creation, deletion and deallocation are long-running: creation and deletion answer with an
  `Azure-AsyncOperation` URL, deallocation with a `Location` URL, each polled some times before done;
- `generalize` is refused (409 OperationNotAllowed) while the VM is running, and a generalized VM
  cannot be started;
- a gallery image version from a VM that is not generalized is refused (400 BadRequest: a different
  OS state than its definition's Generalized), and a version's creation is long-running too;
- deleting a VM deletes its NIC and OS disk when their deleteOption is Delete;
- a scale set's instances are listed a page at a time (`nextLink`); power off, manual upgrade,
  start and delete take `instanceIds` and are long-running (`Location`); a delete removes the
  instances and lowers the set's capacity by as many; a manual upgrade gives an instance the
  model's image reference (its OS disk made again from it), and `on_power_off` / `on_start` let a
  test play the instances' guests (a kubelet stopping, a new one registering);
- `throttle` answers the next requests with 429 and `Retry-After: 0`; `fail_next` and `fail_version`
  make the next VM's or version's creation end Failed, as Azure's operation reports it.
It is a stand-in for what cannot run here, and says so in docs/01-operating-on-azure.md; what it
answers follows from those rules, never from what a test expects."""

from __future__ import annotations

import itertools
import json
import re
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

TOKEN = "test-token"
POLLS = 2  # polls an operation answers "in progress" before it is done


class ResourceManager(ThreadingHTTPServer):
    def __init__(self, token: str = TOKEN) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.token = token
        self.resources: dict[str, dict[str, Any]] = {}
        self.operations: dict[str, dict[str, Any]] = {}
        self.requests: list[tuple[str, str]] = []  # (method, path) of every request that was let in
        self.throttle = 0
        self.fail_next = ""  # the next VM creation ends Failed with this code (no capacity, say)
        self.fail_version = ""  # the next version's creation ends Failed with this code
        self.page_size = 2  # instances per page of a scale set's list (nextLink beyond)
        self.on_power_off: Any = lambda names: None  # what the guests do: the old kubelet stops
        self.on_start: Any = lambda names: None  # the new image boots: its kubelet registers
        self.lock = threading.Lock()
        self._ids = itertools.count(1)
        self._thread = threading.Thread(target=self.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def __enter__(self) -> ResourceManager:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()
        self.server_close()

    def add(self, path: str, body: dict[str, Any]) -> None:
        self.resources[path.lower()] = {"id": path, "name": path.rsplit("/", 1)[-1], **body}

    def get(self, path: str) -> dict[str, Any] | None:
        return self.resources.get(path.lower())

    def instances(self, scale_set: str) -> list[dict[str, Any]]:
        prefix = f"{scale_set.lower()}/virtualmachines/"
        found = [v for k, v in self.resources.items() if k.startswith(prefix)]
        return sorted(found, key=lambda v: int(v["instanceId"]))

    def add_instance(
        self, scale_set: str, instance_id: str, computer_name: str, image: dict[str, Any]
    ) -> None:
        self.add(
            f"{scale_set}/virtualMachines/{instance_id}",
            {
                "instanceId": instance_id,
                "properties": {
                    "osProfile": {"computerName": computer_name},
                    "storageProfile": {"imageReference": dict(image)},
                    "latestModelApplied": False,
                },
                "_power": "running",
            },
        )

    def writes(self) -> list[tuple[str, str]]:
        """The requests that change something (not GETs), in order."""
        return [(m, p) for m, p in self.requests if m != "GET"]

    # --- what each long-running operation does when it is done -----------------------------------

    def operation(self, done: Any, status: str = "Succeeded", error: str = "") -> str:
        op = str(next(self._ids))
        self.operations[op] = {"polls": POLLS, "done": done, "status": status, "error": error}
        return op


VM = re.compile(r"^(?P<group>/subscriptions/[^/]+/resourcegroups/[^/]+)/providers/microsoft\.compute/virtualmachines/(?P<name>[^/]+)(?P<action>/deallocate|/generalize|/start|/instanceview)?$")  # fmt: skip
SCALE_SET = re.compile(r"^.*/providers/microsoft\.compute/virtualmachinescalesets/[^/]+$")
SCALE_SET_ACTION = re.compile(r"^(?P<set>.*/providers/microsoft\.compute/virtualmachinescalesets/[^/]+)/(?P<action>poweroff|manualupgrade|start|delete|virtualmachines)$")  # fmt: skip
VERSION = re.compile(r"^.*/providers/microsoft\.compute/galleries/[^/]+/images/[^/]+/versions/[^/]+$")


class _Handler(BaseHTTPRequestHandler):
    server: ResourceManager

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _answer(self, code: int, body: Any = None, headers: dict[str, str] | None = None) -> None:
        data = json.dumps(body).encode() if body is not None else b""
        self.send_response(code)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _error(self, code: int, error: str, message: str) -> None:
        self._answer(code, {"error": {"code": error, "message": message}})

    def _admit(self) -> tuple[str, dict[str, Any]] | None:
        url = urllib.parse.urlsplit(self.path)
        query = dict(urllib.parse.parse_qsl(url.query))
        if self.headers.get("Authorization") != f"Bearer {self.server.token}":
            self._error(401, "InvalidAuthenticationToken", "The access token is invalid.")
            return None
        if self.server.throttle > 0:
            self.server.throttle -= 1
            self._answer(
                429, {"error": {"code": "TooManyRequests", "message": "throttled"}}, {"Retry-After": "0"}
            )
            return None
        if "api-version" not in query and not url.path.startswith("/operations/"):
            self._error(400, "MissingApiVersionParameter", "The api-version query parameter is required.")
            return None
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length)) if length else {}
        self.server.requests.append((self.command, url.path))
        return url.path, body

    def do_GET(self) -> None:
        admitted = self._admit()
        if admitted is None:
            return
        path, _ = admitted
        s = self.server
        with s.lock:
            if path.startswith("/operations/"):
                return self._poll(path)
            listing = SCALE_SET_ACTION.match(path.lower())
            if listing and listing["action"] == "virtualmachines":
                return self._list(listing["set"])
            vm = VM.match(path.lower())
            if vm and vm["action"] == "/instanceview":
                found = s.get(path.lower().removesuffix("/instanceview"))
                if found is None:
                    return self._error(404, "ResourceNotFound", f"{path} was not found")
                codes = ["ProvisioningState/succeeded", f"PowerState/{found['_power']}"]
                if found.get("_generalized"):
                    codes.append("OSState/generalized")
                return self._answer(200, {"statuses": [{"code": c} for c in codes]})
            found = s.get(path)
            if found is None:
                return self._error(404, "ResourceNotFound", f"{path} was not found")
            return self._answer(200, {k: v for k, v in found.items() if not k.startswith("_")})

    def _list(self, scale_set: str) -> None:
        s = self.server
        if s.get(scale_set) is None:
            return self._error(404, "ResourceNotFound", f"{scale_set} was not found")
        query = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(self.path).query))
        start = int(query.get("skip", 0))
        items = s.instances(scale_set)
        page = [
            {k: v for k, v in i.items() if not k.startswith("_")} for i in items[start : start + s.page_size]
        ]
        body: dict[str, Any] = {"value": page}
        if start + s.page_size < len(items):
            path = urllib.parse.urlsplit(self.path).path
            body["nextLink"] = f"{s.url}{path}?api-version={query['api-version']}&skip={start + s.page_size}"
        self._answer(200, body)

    def _scale_set_action(self, scale_set: str, action: str, body: dict[str, Any]) -> None:
        s = self.server
        model = s.get(scale_set)
        if model is None:
            return self._error(404, "ResourceNotFound", f"{scale_set} was not found")
        ids = body.get("instanceIds")
        if not ids:
            return self._error(400, "InvalidParameter", "instanceIds is required")
        chosen = [s.get(f"{scale_set}/virtualmachines/{i}") for i in ids]
        if any(c is None for c in chosen):
            return self._error(404, "NotFound", f"an instance of {ids} was not found")
        names = [c["properties"]["osProfile"]["computerName"] for c in chosen]  # type: ignore[index]

        def done() -> None:
            for c in chosen:
                assert c is not None
                if action == "poweroff":
                    c["_power"] = "stopped"
                elif action == "manualupgrade":
                    image = model["properties"]["virtualMachineProfile"]["storageProfile"]["imageReference"]
                    c["properties"]["storageProfile"]["imageReference"] = dict(image)
                    c["properties"]["latestModelApplied"] = True
                elif action == "start":
                    c["_power"] = "running"
                elif action == "delete":
                    s.resources.pop(f"{scale_set}/virtualmachines/{c['instanceId']}".lower(), None)
            if action == "delete" and "sku" in model:
                model["sku"]["capacity"] = max(0, int(model["sku"].get("capacity", 0)) - len(chosen))
            if action == "poweroff":
                s.on_power_off(names)
            if action == "start":
                s.on_start(names)

        op = s.operation(done)
        self._answer(202, None, {"Location": self._url(f"/operations/{op}/result"), "Retry-After": "0"})

    def _poll(self, path: str) -> None:
        op_id, _, kind = path.removeprefix("/operations/").partition("/")
        op = self.server.operations.get(op_id)
        if op is None:
            return self._error(404, "OperationNotFound", path)
        if op["polls"] > 0:
            op["polls"] -= 1
            if kind == "result":  # a Location URL: 202 until done
                return self._answer(202, None, {"Location": self._url(path), "Retry-After": "0"})
            return self._answer(200, {"status": "InProgress"}, {"Retry-After": "0"})
        if op["done"] is not None:
            op["done"]()
            op["done"] = None
        if kind == "result":
            return self._answer(200 if op["status"] == "Succeeded" else 500, None)
        body: dict[str, Any] = {"status": op["status"]}
        if op["error"]:
            body["error"] = {"code": op["error"], "message": f"the operation failed: {op['error']}"}
        return self._answer(200, body)

    def _url(self, path: str) -> str:
        return f"{self.server.url}{path}"

    def do_PUT(self) -> None:
        admitted = self._admit()
        if admitted is None:
            return
        path, body = admitted
        with self.server.lock:
            if VM.match(path.lower()):
                return self._put_vm(path, body)
            if VERSION.match(path.lower()):
                return self._put_version(path, body)
            self._error(400, "NotSupportedHere", f"PUT {path}")

    def _put_vm(self, path: str, body: dict[str, Any]) -> None:
        s = self.server
        props = body.get("properties") or {}
        try:
            nic = props["networkProfile"]["networkInterfaceConfigurations"][0]
            subnet = nic["properties"]["ipConfigurations"][0]["properties"]["subnet"]["id"]
            props["hardwareProfile"]["vmSize"], props["storageProfile"]["imageReference"]["publisher"]
            props["osProfile"]["linuxConfiguration"]["ssh"]["publicKeys"][0]["keyData"]
        except (KeyError, IndexError, TypeError) as exc:
            return self._error(400, "InvalidParameter", f"the VM's body lacks {exc}")
        if s.get(subnet) is None:
            return self._error(400, "InvalidResourceReference", f"subnet {subnet} was not found")
        if not body.get("location"):
            return self._error(400, "LocationRequired", "The location property is required.")
        if s.get(path) is not None:
            return self._error(409, "OperationNotAllowed", "changing a VM is not modelled here")
        group = VM.match(path.lower())["group"]  # type: ignore[index]
        name = path.rsplit("/", 1)[-1]
        nic_path = f"{group}/providers/Microsoft.Network/networkInterfaces/{nic['name']}"
        disk_path = f"{group}/providers/Microsoft.Compute/disks/{name}_OsDisk_1"
        s.add(nic_path, {"properties": {"ipConfigurations": [{"properties": {"privateIPAddress": "10.1.0.250", "subnet": {"id": subnet}}}]}})  # fmt: skip
        s.add(disk_path, {"properties": {"diskState": "Attached"}})
        stored = json.loads(json.dumps(body))
        stored["properties"]["provisioningState"] = "Creating"
        stored["properties"]["networkProfile"]["networkInterfaces"] = [
            {"id": nic_path, "properties": {"deleteOption": nic["properties"].get("deleteOption", "Detach")}}
        ]
        stored["properties"]["storageProfile"]["osDisk"]["managedDisk"]["id"] = disk_path
        s.add(path, {**stored, "_power": "starting"})

        failure, s.fail_next = s.fail_next, ""

        def done() -> None:
            vm = s.get(path)
            if vm is not None:
                vm["properties"]["provisioningState"] = "Failed" if failure else "Succeeded"
                vm["_power"] = "stopped" if failure else "running"

        op = s.operation(done, "Failed" if failure else "Succeeded", failure)
        answer = {k: v for k, v in s.get(path).items() if not k.startswith("_")}  # type: ignore[union-attr]
        self._answer(
            201, answer, {"Azure-AsyncOperation": self._url(f"/operations/{op}"), "Retry-After": "0"}
        )

    def _put_version(self, path: str, body: dict[str, Any]) -> None:
        s = self.server
        definition = s.get(path.rsplit("/versions/", 1)[0])
        if definition is None:
            return self._error(404, "ParentResourceNotFound", "the image definition was not found")
        if s.get(path) is not None:
            return self._error(409, "Conflict", "changing a version's source is not allowed")
        source = ((body.get("properties") or {}).get("storageProfile") or {}).get("source") or {}
        vm = s.get(source.get("virtualMachineId") or "")
        if vm is None:
            return self._error(400, "InvalidParameter", "the source virtual machine was not found")
        state = "Generalized" if vm.get("_generalized") else "Specialized"
        wanted = definition["properties"]["osState"]
        if state != wanted:
            return self._error(
                400,
                "BadRequest",
                f"The resource with id '{vm['id']}' has a different OS state ['{state}'] than the parent "
                f"gallery image OS state ['{wanted}'].",
            )
        s.add(path, {**body, "properties": {**body["properties"], "provisioningState": "Creating"}})

        failure, s.fail_version = s.fail_version, ""

        def done() -> None:
            s.get(path)["properties"]["provisioningState"] = "Failed" if failure else "Succeeded"  # type: ignore[index]

        op = s.operation(done, "Failed" if failure else "Succeeded", failure)
        answer = {k: v for k, v in s.get(path).items() if not k.startswith("_")}  # type: ignore[union-attr]
        self._answer(201, answer, {"Azure-AsyncOperation": self._url(f"/operations/{op}")})

    def do_POST(self) -> None:
        admitted = self._admit()
        if admitted is None:
            return
        path, body = admitted
        s = self.server
        with s.lock:
            action = SCALE_SET_ACTION.match(path.lower())
            if action and action["action"] != "virtualmachines":
                return self._scale_set_action(action["set"], action["action"], body)
            vm = VM.match(path.lower())
            found = s.get(path.rsplit("/", 1)[0]) if vm and vm["action"] else None
            if found is None:
                return self._error(404, "ResourceNotFound", f"{path} was not found")
            name = found["name"]
            if vm["action"] == "/deallocate":  # type: ignore[index]
                found["_power"] = "deallocating"

                def done() -> None:
                    found["_power"] = "deallocated"

                op = s.operation(done)
                return self._answer(202, None, {"Location": self._url(f"/operations/{op}/result")})
            if vm["action"] == "/generalize":  # type: ignore[index]
                if found["_power"] not in ("stopped", "deallocated"):
                    return self._error(
                        409,
                        "OperationNotAllowed",
                        f"Operation 'generalize' is not allowed on VM '{name}' since the VM is running. "
                        "Please power off explicitly in case you shut down the VM from inside the guest "
                        "operating system.",
                    )
                found["_generalized"] = True
                return self._answer(200)
            if vm["action"] == "/start":  # type: ignore[index]
                if found.get("_generalized"):
                    return self._error(
                        409,
                        "OperationNotAllowed",
                        f"Operation 'start' is not allowed on VM '{name}' since the VM is generalized.",
                    )
                found["_power"] = "running"
                return self._answer(200)
        self._error(400, "NotSupportedHere", f"POST {path}")

    def do_DELETE(self) -> None:
        admitted = self._admit()
        if admitted is None:
            return
        path, _ = admitted
        s = self.server
        with s.lock:
            found = s.get(path)
            if found is None:
                return self._answer(204)
            if VM.match(path.lower()):
                found["properties"]["provisioningState"] = "Deleting"

                def done() -> None:
                    props = found["properties"]
                    for nic in props["networkProfile"].get("networkInterfaces", []):
                        if nic["properties"]["deleteOption"] == "Delete":
                            s.resources.pop(nic["id"].lower(), None)
                    disk = props["storageProfile"]["osDisk"]
                    if disk.get("deleteOption") == "Delete":
                        s.resources.pop(disk["managedDisk"]["id"].lower(), None)
                    s.resources.pop(path.lower(), None)

                op = s.operation(done)
                return self._answer(202, None, {"Azure-AsyncOperation": self._url(f"/operations/{op}")})
            s.resources.pop(path.lower())
            self._answer(200)
