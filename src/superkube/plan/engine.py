"""Run the real Pulumi program under a recording mock engine: no cloud, no credentials, no CLI.

The stack's config is read the way the Pulumi CLI reads it (stack file over Pulumi.yaml defaults,
every value a string), validated once, and then `__main__.py` runs unchanged. Every resource the
program registers is recorded with its type, name, inputs, parent and dependencies.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import difflib
import json
import runpy
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Executor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar, TypeVarTuple

import pulumi
import yaml
from google.protobuf import struct_pb2
from pulumi.runtime import mocks as pulumi_mocks
from pulumi.runtime import resource as pulumi_resource
from pulumi.runtime import rpc, settings
from pulumi.runtime import stack as pulumi_stack
from pulumi.runtime.proto import resource_pb2, source_pb2
from pulumi.runtime.sync_await import _ensure_event_loop, _sync_await

from superkube.cluster.render import SECRET
from superkube.model import files, strictyaml, vmsizes
from superkube.model.ipam import AddressPlan, plan_addresses
from superkube.model.spec import (
    ARRAY_KEYS,
    KUBECONFIG_KEY,
    NAMESPACE,
    YAML_KEYS,
    ClusterSpec,
    SpecError,
    from_config,
)
from superkube.model.teams import PLAN_WEBHOOK_TLS, WEBHOOK_TLS_KEY
from superkube.plan import collector

PROJECT = "superkube"
MOCK_SUBSCRIPTION = "00000000-0000-0000-0000-000000000000"
MOCK_TENANT = "11111111-1111-1111-1111-111111111111"

# How the mock engine names and identifies each Azure type: (the input holding the Azure name,
# the ARM path under the resource group). IDs look like the real ones so references resolve alike.
_ARM: dict[str, tuple[str, str]] = {
    "azure-native:resources:ResourceGroup": ("resourceGroupName", ""),
    "azure-native:network:VirtualNetwork": (
        "virtualNetworkName",
        "Microsoft.Network/virtualNetworks/{virtualNetworkName}",
    ),
    "azure-native:network:Subnet": (
        "subnetName",
        "Microsoft.Network/virtualNetworks/{virtualNetworkName}/subnets/{subnetName}",
    ),
    "azure-native:network:VirtualNetworkPeering": (
        "virtualNetworkPeeringName",
        "Microsoft.Network/virtualNetworks/{virtualNetworkName}/virtualNetworkPeerings/{virtualNetworkPeeringName}",
    ),
    "azure-native:network:NetworkSecurityGroup": (
        "networkSecurityGroupName",
        "Microsoft.Network/networkSecurityGroups/{networkSecurityGroupName}",
    ),
    "azure-native:network:RouteTable": ("routeTableName", "Microsoft.Network/routeTables/{routeTableName}"),
    "azure-native:network:Route": (
        "routeName",
        "Microsoft.Network/routeTables/{routeTableName}/routes/{routeName}",
    ),
    "azure-native:network:NetworkInterface": (
        "networkInterfaceName",
        "Microsoft.Network/networkInterfaces/{networkInterfaceName}",
    ),
    "azure-native:network:LoadBalancer": (
        "loadBalancerName",
        "Microsoft.Network/loadBalancers/{loadBalancerName}",
    ),
    "azure-native:compute:VirtualMachine": ("vmName", "Microsoft.Compute/virtualMachines/{vmName}"),
    "azure-native:managedidentity:UserAssignedIdentity": (
        "resourceName",
        "Microsoft.ManagedIdentity/userAssignedIdentities/{resourceName}",
    ),
    "azure-native:compute:VirtualMachineScaleSet": (
        "vmScaleSetName",
        "Microsoft.Compute/virtualMachineScaleSets/{vmScaleSetName}",
    ),
    "azure-native:compute:Gallery": ("galleryName", "Microsoft.Compute/galleries/{galleryName}"),
    "azure-native:compute:GalleryImage": (
        "galleryImageName",
        "Microsoft.Compute/galleries/{galleryName}/images/{galleryImageName}",
    ),
}


PLAN_KUBECONFIG = "plan: no cluster is contacted"
"""Stands in for the admin kubeconfig secret, so the plan shows the in-cluster layer it would deploy."""


class PlanError(Exception):
    """The program itself failed under the mock engine (not a config error)."""


@dataclass
class Resource:
    urn: str
    type: str
    name: str
    custom: bool
    parent: str | None
    dependencies: list[str]
    inputs: dict[str, Any]
    id: str = ""
    provider: str | None = None  # the explicit provider reference, where the program set one
    ignore_changes: tuple[str, ...] = ()  # properties `pulumi up` leaves as they are (not in to_dict)

    def to_dict(self) -> dict[str, Any]:
        out = {
            "urn": self.urn,
            "type": self.type,
            "name": self.name,
            "custom": self.custom,
            "id": self.id,
            "parent": self.parent,
            "dependencies": self.dependencies,
            "inputs": _copied(self.inputs),
        }
        if self.provider:
            out["provider"] = self.provider
        return out


def _copied(value: Any) -> Any:
    """A copy of recorded inputs, which `_plain` made of dicts, lists and scalars only: a third of
    the time `copy.deepcopy` takes, which looks up how to copy every value it meets."""
    if isinstance(value, dict):
        return {k: _copied(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_copied(v) for v in value]
    return value


@dataclass
class Plan:
    stack: str
    spec: ClusterSpec
    addresses: AddressPlan
    resources: list[Resource]
    outputs: dict[str, Any]
    seconds: float = 0.0
    config: dict[str, str] = field(default_factory=dict)

    @property
    def cluster(self) -> str:
        return self.addresses.cluster

    def of_type(self, type_: str) -> list[Resource]:
        return [r for r in self.resources if r.type == type_]

    def by_urn(self, urn: str) -> Resource:
        for r in self.resources:
            if r.urn == urn:
                return r
        raise KeyError(urn)

    def children(self, urn: str) -> list[Resource]:
        return [r for r in self.resources if r.parent == urn]

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for r in self.resources:
            out[r.type] = out.get(r.type, 0) + 1
        return dict(sorted(out.items()))

    def to_dict(self) -> dict[str, Any]:
        from superkube.plan.report import address_rows, capacity, limit_rows, topology

        return {
            "format": "superkube-plan/1",
            "stack": self.stack,
            "cluster": self.cluster,
            "config": self.config,
            "resource_counts": self.counts(),
            "topology": topology(self),
            "address_plan": {"subnets": address_rows(self.addresses), "limits": limit_rows(self.addresses)},
            "capacity": capacity(self.addresses),
            "outputs": self.outputs,
            "resources": [r.to_dict() for r in self.resources],
        }


# --- reading a stack the way the Pulumi CLI does -------------------------------------------------


def find_project(start: Path | None = None) -> Path:
    """The directory of the superkube Pulumi.yaml at or above `start`, else the source checkout's."""
    here = (start or Path.cwd()).resolve()
    for candidate in (here, *here.parents):
        project_file = candidate / "Pulumi.yaml"
        if project_file.is_file() and _project_name(project_file) == PROJECT:
            return candidate
    checkout = Path(__file__).resolve().parents[3]
    if (checkout / "Pulumi.yaml").is_file():
        return checkout
    raise SpecError(
        "Pulumi.yaml",
        "no superkube project found here or above",
        "run from the superkube checkout or pass --project",
    )


def _project_name(path: Path) -> str | None:
    try:
        data = strictyaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError):
        return None
    return data.get("name") if isinstance(data, dict) else None


def stack_path(project: Path, stack: str) -> Path:
    if stack.endswith((".yaml", ".yml")) or "/" in stack:
        return Path(stack)
    return project / "stacks" / f"Pulumi.{stack}.yaml"


def stack_name(stack: str) -> str:
    """`dev` for `dev` and for `stacks/Pulumi.dev.yaml`."""
    if stack.endswith((".yaml", ".yml")) or "/" in stack:
        name = Path(stack).name
        for suffix in (".yaml", ".yml"):
            name = name.removesuffix(suffix)
        return name.removeprefix("Pulumi.")
    return stack


def _project_config(project: Path) -> dict[str, dict[str, Any]]:
    """Pulumi.yaml's config declarations: key -> {type, default, description}."""
    try:
        data = files.load(
            project / "Pulumi.yaml",
            fix="give the superkube project's directory (--project), or restore its Pulumi.yaml",
            what="a mapping with name: superkube",
        )
    except files.FileError as exc:
        raise SpecError(exc.where, exc.problem, exc.fix) from None
    config = data.get("config") or {}
    if not isinstance(config, dict):
        raise SpecError(
            f"{project / 'Pulumi.yaml'}",
            "config: must be a mapping",
            "regenerate it: superkube config-schema --write",
        )
    return {str(k): v if isinstance(v, dict) else {} for k, v in config.items()}


def _as_config_string(value: Any) -> str:
    """Pulumi hands every config value to the program as a string; structures as JSON."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return value
    if isinstance(value, int | float):
        return str(value)
    return json.dumps(value)


DUPLICATE_FIX = "keep one of them (YAML keeps only the last value, and the Pulumi CLI refuses such a file)"


def _check_embedded_yaml(key: str, value: str, text: str, path: Path) -> None:
    """A YAML document held in a string value that names a key twice, or is not YAML: say so at the
    stack file's lines (a block's first line plus the line within it)."""
    try:
        strictyaml.load(value)
    except strictyaml.DuplicateKeyError as exc:
        raise SpecError(
            key, exc.message(_value_first_line(text, key) - 1, str(path)), DUPLICATE_FIX
        ) from None
    except yaml.YAMLError as exc:
        first, block = _value_start(text, key)
        mark = getattr(exc, "problem_mark", None)
        if not block or mark is None:
            return  # the spec says what is wrong with it, naming the key and the line of the value
        line = first + mark.line
        lines = text.splitlines()
        body = lines[first - 1] if 0 < first <= len(lines) else ""
        indent = len(body) - len(body.lstrip(" "))
        problem = getattr(exc, "problem", None) or getattr(exc, "context", None)
        raise SpecError(
            key,
            f"is not valid YAML at line {line}, column {mark.column + 1 + indent} of {path}"
            + (f" ({problem})" if problem else ""),
            "fix the YAML syntax of the block",
        ) from None


def _value_start(text: str, key: str) -> tuple[int, bool]:
    """(the stack file's line (1-based) holding the first line of config value `key`, whether the
    value is a block scalar (`key: |`), whose lines are the file's lines)."""
    root = strictyaml.compose(text)
    for section_key, section in getattr(root, "value", []):
        if section_key.value != "config":
            continue
        for key_node, value_node in section.value:
            if key in (key_node.value, f"{NAMESPACE}:{key_node.value}"):
                block = getattr(value_node, "style", None) in ("|", ">")
                return value_node.start_mark.line + (2 if block else 1), block
    return 1, False


def _value_first_line(text: str, key: str) -> int:
    """The stack file's line (1-based) holding the first line of config value `key`."""
    return _value_start(text, key)[0]


CONFIG_NAMESPACES = (
    NAMESPACE,
    KUBECONFIG_KEY.partition(":")[0],
    WEBHOOK_TLS_KEY.partition(":")[0],
    "azure-native",
    "pulumi",
)
"""The namespaces a stack's config keys may be in: superkube's own, its secrets', and those of the
providers the program uses (azure-native; kubernetes, whose kubeconfig it reads) and Pulumi's."""


def _check_namespace(key: str) -> None:
    """A key in a namespace nothing reads (a typo such as superkub:region) is refused, not ignored."""
    namespace, _, short = key.partition(":")
    if namespace in CONFIG_NAMESPACES:
        return
    close = difflib.get_close_matches(namespace, CONFIG_NAMESPACES, n=1, cutoff=0.6)
    guess = f"{close[0]}:{short}" if close else f"{NAMESPACE}:{short}"
    raise SpecError(
        key,
        f"namespace {namespace!r} is neither superkube's nor a provider's "
        f"({', '.join(CONFIG_NAMESPACES)}), so nothing would read it",
        f"did you mean {guess}?",
    )


def read_stack_config(project: Path, stack: str) -> dict[str, str]:
    """Namespaced config of a stack, stack values over Pulumi.yaml defaults, all strings."""
    path = stack_path(project, stack)
    where = f"{path}"
    if not path.exists():
        known = sorted(
            p.name.removeprefix("Pulumi.").removesuffix(".yaml")
            for p in (project / "stacks").glob("Pulumi.*.yaml")
        )
        raise SpecError(
            where, "no such stack file", f"use one of: {', '.join(known) or 'none'} (or create it)"
        )
    try:
        text = files.read_text(path)
    except files.FileError as exc:
        raise SpecError(exc.where, exc.problem, exc.fix) from None
    try:
        data = strictyaml.load(text)
    except strictyaml.DuplicateKeyError as exc:
        raise SpecError(where, str(exc), DUPLICATE_FIX) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or getattr(exc, "context", None)
        raise SpecError(
            where, f"is not valid YAML{at}" + (f" ({problem})" if problem else ""), "fix the YAML syntax"
        ) from None
    if data is None or (isinstance(data, dict) and not data.get("config") and "config" in data):
        raise SpecError(
            where,
            "is empty" if data is None else "has an empty config:",
            "add a config: mapping with at least superkube:ssh_public_key (stacks/Pulumi.dev.yaml shows the shape)",
        )
    if not isinstance(data, dict) or not isinstance(data.get("config", {}), dict):
        raise SpecError(
            where, "must be a mapping with a config: mapping", "see stacks/Pulumi.dev.yaml for the shape"
        )
    unexpected = set(data) - {"config", "secretsprovider", "encryptionsalt", "encryptedkey", "environment"}
    if unexpected:
        raise SpecError(
            where, f"unknown top-level key {sorted(unexpected)[0]!r}", "put settings under config:"
        )
    if "config" not in data:
        raise SpecError(
            where,
            "has no config: mapping",
            "add one with at least superkube:ssh_public_key (stacks/Pulumi.dev.yaml shows the shape)",
        )
    declared = _project_config(project)
    values: dict[str, str] = {}
    for key, value in (data.get("config") or {}).items():
        full = str(key) if ":" in str(key) else f"{NAMESPACE}:{key}"
        _check_namespace(full)
        namespace, _, short = full.partition(":")
        if namespace == NAMESPACE and short in declared:
            want = declared[short].get("type", "string")
            if value is None and short not in YAML_KEYS | ARRAY_KEYS:
                default = declared[short].get("default")
                raise SpecError(
                    full,
                    "has no value (YAML null)",
                    "write one, or remove the line"
                    + (
                        f" for the default ({_as_config_string(default)})"
                        if default not in (None, "")
                        else ""
                    ),
                )
            # as the Pulumi CLI does: any scalar is a string's text (a share written 0.1 is "0.1"),
            # a mapping or a list is not
            if want == "string" and isinstance(value, dict | list):
                raise SpecError(
                    f"{full}",
                    f"must be a string, got a YAML {'mapping' if isinstance(value, dict) else 'list'}",
                    f"write it as a block string: '{short}: |' with the YAML indented below it",
                )
            if want == "array" and not isinstance(value, list):
                raise SpecError(full, f"must be a list, got {value!r}", f'write {short}: ["1", "2", "3"]')
        if full in (KUBECONFIG_KEY, WEBHOOK_TLS_KEY):
            continue  # secrets the plan never reads: the mock engine talks to no cluster
        if short in YAML_KEYS and isinstance(value, str):
            _check_embedded_yaml(full, value, text, path)
        if isinstance(value, dict) and "secure" in value:
            raise SpecError(
                full,
                "is encrypted, and the mock engine has no secrets provider",
                "keep plan inputs in plaintext",
            )
        values[full] = _as_config_string(value)
    for short, decl in declared.items():
        full = f"{NAMESPACE}:{short}"
        if full not in values and "default" in decl:
            values[full] = _as_config_string(decl["default"])
    return values


def spec_from_config(config: dict[str, str], stack: str) -> tuple[ClusterSpec, AddressPlan]:
    ours = {k.partition(":")[2]: v for k, v in config.items() if k.startswith(f"{NAMESPACE}:")}
    spec = from_config(ours)
    return spec, plan_addresses(spec, stack)


def load(project: Path, stack: str) -> tuple[dict[str, str], ClusterSpec, AddressPlan]:
    """Read and validate a stack; raises SpecError (one line) before anything runs or is written."""
    config = read_stack_config(project, stack)
    try:
        spec, addresses = spec_from_config(config, stack_name(stack))
        vmsizes.check(spec)
    except SpecError as exc:
        if "pulumi config set " not in exc.fix:
            raise
        # a `pulumi config set` hint must name the stack it is about
        fix = exc.fix.replace("pulumi config set ", f"pulumi config set -s {stack_name(stack)} ")
        raise SpecError(exc.key, exc.problem, fix) from None
    return config, spec, addresses


# --- the recording mock engine ------------------------------------------------------------------


class _Mocks(pulumi.runtime.Mocks):
    def __init__(self) -> None:
        self.last_inputs: dict[str, Any] = {}

    def new_resource(self, args: pulumi.runtime.MockResourceArgs) -> tuple[str, dict[str, Any]]:
        self.last_inputs = args.inputs
        if not args.custom:
            return "", dict(args.inputs)
        name_key, path = _ARM.get(args.typ, ("", ""))
        azure_name = args.inputs.get(name_key) or args.name
        rg = args.inputs.get("resourceGroupName", "")
        if args.typ == "azure-native:resources:ResourceGroup":
            rid = f"/subscriptions/{MOCK_SUBSCRIPTION}/resourceGroups/{azure_name}"
        else:
            try:
                tail = path.format(**args.inputs) if path else f"{args.typ}/{azure_name}"
            except KeyError:
                tail = f"{args.typ}/{azure_name}"
            rid = f"/subscriptions/{MOCK_SUBSCRIPTION}/resourceGroups/{rg}/providers/{tail}"
        outputs = {**args.inputs, "name": azure_name}
        identity = outputs.get("identity")
        if isinstance(identity, dict) and isinstance(identity.get("userAssignedIdentities"), list):
            # an input list of identity IDs comes back from Azure as a map keyed by ID
            outputs["identity"] = {
                **identity,
                "userAssignedIdentities": {i: {} for i in identity["userAssignedIdentities"]},
            }
        if args.typ == "azure-native:managedidentity:UserAssignedIdentity":
            # Azure assigns these; the plan's stand-ins are stable per identity so saved plans diff cleanly
            outputs["clientId"] = str(uuid.uuid5(uuid.NAMESPACE_URL, f"{rid}#client"))
            outputs["principalId"] = str(uuid.uuid5(uuid.NAMESPACE_URL, f"{rid}#principal"))
        return rid, outputs

    def call(self, args: pulumi.runtime.MockCallArgs) -> dict[str, Any]:  # type: ignore[override]
        if args.token == "azure-native:authorization:getClientConfig":
            return {
                "clientId": "superkube-plan",
                "objectId": "superkube-plan",
                "subscriptionId": MOCK_SUBSCRIPTION,
                "tenantId": MOCK_TENANT,
            }
        raise PlanError(f"the program called {args.token}, which the plan's mock engine does not answer")


class _RecordingMonitor(pulumi_mocks.MockMonitor):
    def __init__(self, mocks: _Mocks) -> None:
        super().__init__(mocks)
        self.recorded: list[Resource] = []
        self._mocks = mocks

    def RegisterResource(self, request: Any) -> Any:
        """The SDK's mock `RegisterResource`, but for how it serializes the mock's answer (see
        `_answer`), and each resource recorded."""
        if request.type == "pulumi:pulumi:Stack":
            return super().RegisterResource(request)
        urn = self.make_urn(request.parent, request.type, request.name)
        _ensure_event_loop()
        inputs = rpc.deserialize_properties(request.object)
        id_, state = self._mocks.new_resource(
            pulumi.runtime.MockResourceArgs(
                typ=request.type,
                name=request.name,
                inputs=inputs,
                provider=request.provider,
                resource_id=request.importId,
                custom=request.custom or False,
                transforms=pulumi_mocks._resolve_callbacks(request.transforms),
            )
        )
        self.resources[urn] = pulumi_mocks.MockMonitor.ResourceRegistration(urn, id_, state)
        response = resource_pb2.RegisterResourceResponse(
            urn=urn, id=id_, object=_answer(request.object, inputs, state)
        )
        self.recorded.append(
            Resource(
                urn=response.urn,
                type=request.type,
                name=request.name,
                custom=bool(request.custom),
                parent=request.parent or None,
                dependencies=sorted(set(request.dependencies)),
                inputs=_plain(self._mocks.last_inputs),
                id=response.id,
                provider=request.provider or None,
                ignore_changes=tuple(request.ignoreChanges),
            )
        )
        return response


def _answer(sent: struct_pb2.Struct, inputs: dict[str, Any], outputs: dict[str, Any]) -> struct_pb2.Struct:
    """The mock's outputs, serialized as the SDK's mock monitor serializes them.

    The outputs are the inputs (the very values `sent` was read into) with a few added or changed
    (`name`, an identity's IDs). `sent` is those inputs serialized already, and reading then
    serializing them again gives the same message; so the answer is a copy of it with only what
    the mock added or changed serialized on top. Serializing every output again, as the SDK's
    monitor does, was a tenth of the time each resource takes to register."""
    answer = struct_pb2.Struct()
    answer.CopyFrom(sent)
    for key in inputs.keys() - outputs.keys():
        del answer.fields[key]
    changed = {k: v for k, v in outputs.items() if k not in inputs or inputs[k] is not v}
    if changed:
        serialized = pulumi_mocks._sync_await(rpc.serialize_properties(changed, {}))
        for key in changed:
            if key in serialized.fields:
                answer.fields[key].CopyFrom(serialized.fields[key])
            elif key in answer.fields:
                del answer.fields[key]
    return answer


def _without_version_aliases(args: pulumi.ResourceTransformationArgs) -> pulumi.ResourceTransformationResult:
    """Drop azure-native's API-version type aliases before the SDK turns each into a URN output.

    Every azure-native resource carries ~60 aliases such as `azure-native:network/v20230401:Subnet`,
    which only matter when an existing stack's state is migrated between provider versions. A plan
    has no prior state, and the mock monitor ignores aliases, but building them costs about two
    thirds of the plan's time. The program's own aliases (anything else) are kept.
    """
    aliases = args.opts.aliases
    if aliases:
        kept = [a for a in aliases if not (isinstance(a, pulumi.Alias) and _is_version_alias(a.type_))]
        if len(kept) != len(aliases):
            args.opts.aliases = kept
            return pulumi.ResourceTransformationResult(args.props, args.opts)
    return pulumi.ResourceTransformationResult(args.props, args.opts)


def _is_version_alias(type_: Any) -> bool:
    return isinstance(type_, str) and type_.startswith("azure-native:") and "/v" in type_.split(":")[1]


@contextlib.contextmanager
def _no_stack_traces() -> Iterator[None]:
    """Register resources without the caller's stack trace, which the mock monitor never reads.

    The SDK sends one with every resource so the engine can point at the line that made it. Taking it
    reads every frame's source line: a fifth of a plan's time under the mock engine."""
    taken = pulumi_resource._get_stack_trace
    pulumi_resource._get_stack_trace = _empty_stack_trace
    try:
        yield
    finally:
        pulumi_resource._get_stack_trace = taken


def _empty_stack_trace() -> Any:
    return source_pb2.StackTrace()


_T = TypeVar("_T")
_Args = TypeVarTuple("_Args")


class _PlanLoop(asyncio.SelectorEventLoop):
    """The plan's event loop: a call the SDK hands to an executor runs at once, in this thread.

    Those calls are the program's requests to the monitor, which under the mock engine is a method of
    this process, not a remote engine: registering a resource, answering an invoke. Handed to a worker
    thread, each came back through the loop's self-pipe, and the two threads took turns at the
    interpreter for every resource of the plan."""

    def run_in_executor(
        self, executor: Executor | None, func: Callable[[*_Args], _T], *args: *_Args
    ) -> asyncio.Future[_T]:
        done = self.create_future()
        try:
            done.set_result(func(*args))
        except Exception as exc:
            done.set_exception(exc)
        return done


def _at_once(awaitable: Any) -> Any:
    """The mock monitor's `_sync_await`: its serializing of what it answers, run in this thread.

    The monitor serializes a resource's state with the SDK's coroutine and waits for it on an event
    loop; here the monitor runs inside the plan's running loop (`_PlanLoop`), from one of the loop's
    own callbacks. The state is plain data, so the coroutine ends without waiting for anything; where
    it does wait for a future, the loop runs until that future is done, as the SDK's wait does."""
    if not asyncio.iscoroutine(awaitable):
        return _sync_await(awaitable)
    while True:
        try:
            waiting = awaitable.send(None)
        except StopIteration as done:
            return done.value
        if waiting is not None:
            waiting._asyncio_future_blocking = False
            with contextlib.suppress(Exception, asyncio.CancelledError):
                _sync_await(waiting)  # its outcome reaches the coroutine when it resumes


@contextlib.contextmanager
def _mock_calls_at_once() -> Iterator[None]:
    taken = pulumi_mocks._sync_await
    pulumi_mocks._sync_await = _at_once
    try:
        yield
    finally:
        pulumi_mocks._sync_await = taken


_SECRET_SIG = "4dabf18193072939515e22adb298388d"  # Pulumi's marker of a serialized secret value
"""What a plan records in place of a secret value."""


def _plain(value: Any) -> Any:
    """Inputs as JSON-ready data (the mock engine may hand back tuples and unknowns).

    Secrets are masked, whole numbers are ints again (the engine's wire format carries every
    number as a float; Kubernetes schemas want integers where the program wrote integers), and
    mappings have their keys sorted: the engine hands them back in no fixed order, and a saved plan
    must be the same bytes every time.
    """
    if isinstance(value, dict):
        if value.get(_SECRET_SIG) is not None:
            return SECRET
        return {k: _plain(value[k]) for k in sorted(value)}
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if value is None or isinstance(value, str | int | float | bool):
        return value
    return str(value)


def run(project: Path, stack: str, secrets: Mapping[str, str] | None = None) -> Plan:
    """Validate the stack, then run `__main__.py` under the mock engine and record every resource.

    The stack's secrets (kubeconfig, webhook TLS) are placeholders unless `secrets` gives them, as
    `pulumi config set --secret` does; the values the program marks secret are recorded as SECRET."""
    started = time.perf_counter()
    config, spec, addresses = load(project, stack)
    name = stack_name(stack)
    if str(project) not in sys.path:
        sys.path.insert(0, str(project))
    main = project / "__main__.py"

    def body() -> tuple[list[Resource], dict[str, Any]]:
        loop = _PlanLoop()
        asyncio.set_event_loop(loop)
        try:
            pulumi.runtime.set_all_config(
                {
                    **config,
                    KUBECONFIG_KEY: PLAN_KUBECONFIG,
                    WEBHOOK_TLS_KEY: PLAN_WEBHOOK_TLS,
                    **(secrets or {}),
                }
            )
            mocks = _Mocks()
            monitor = _RecordingMonitor(mocks)
            pulumi_mocks.set_mocks(mocks, project=PROJECT, stack=name, preview=False, monitor=monitor)
            pulumi_stack.register_stack_transformation(_without_version_aliases)

            def program() -> None:
                runpy.run_path(str(main), run_name="__main__")

            _sync_await(pulumi_stack.run_pulumi_func(program))
            root = settings.get_root_resource()
            exported = getattr(root, "outputs", {}) or {}
            outputs = _sync_await(pulumi.Output.from_input(exported).future()) or {}
            return monitor.recorded, _plain(outputs)
        finally:
            loop.close()
            asyncio.set_event_loop(None)

    try:
        with collector.paused(), _no_stack_traces(), _mock_calls_at_once():
            recorded, outputs = contextvars.Context().run(body)
    except pulumi.RunError as exc:
        raise PlanError(str(exc)) from None
    except (ValueError, TypeError, KeyError) as exc:
        raise PlanError(f"the program failed under the mock engine: {type(exc).__name__}: {exc}") from exc
    return Plan(
        stack=name,
        spec=spec,
        addresses=addresses,
        resources=sorted(recorded, key=lambda r: r.urn),  # a stable order: saved plans diff cleanly
        outputs=outputs,
        seconds=time.perf_counter() - started,
        config=config,
    )
