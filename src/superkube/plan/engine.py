"""Run the real Pulumi program under a recording mock engine: no cloud, no credentials, no CLI.

The stack's config is read the way the Pulumi CLI reads it (stack file over Pulumi.yaml defaults,
every value a string), validated once, and then `__main__.py` runs unchanged. Every resource the
program registers is recorded with its type, name, inputs, parent and dependencies.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
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
from google.protobuf import struct_pb2
from pulumi.runtime import mocks as pulumi_mocks
from pulumi.runtime import resource as pulumi_resource
from pulumi.runtime import rpc, settings
from pulumi.runtime import stack as pulumi_stack
from pulumi.runtime.proto import resource_pb2, source_pb2
from pulumi.runtime.sync_await import _ensure_event_loop, _sync_await

from superkube.cluster.render import SECRET
from superkube.model.ipam import AddressPlan
from superkube.model.spec import (
    KUBECONFIG_KEY,
    ClusterSpec,
)
from superkube.model.teams import PLAN_WEBHOOK_TLS, WEBHOOK_TLS_KEY
from superkube.plan import collector
from superkube.plan.stacks import (  # noqa: F401  (read a stack: the plan's callers ask here)
    CONFIG_NAMESPACES,
    DUPLICATE_FIX,
    PROJECT,
    find_project,
    load,
    read_stack_config,
    spec_from_config,
    stack_name,
    stack_path,
)

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
