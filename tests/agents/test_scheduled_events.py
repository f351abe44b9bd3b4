"""Azure Scheduled Events: the document read as Azure documents it, what each event means for the
node, and the approval once drained, against the lab's metadata service on loopback (Azure's format,
the lab's events file)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from superkube.agents import gpu_probe
from superkube.agents import node_health as nh
from superkube.agents import scheduled_events as se
from superkube.lab import imds
from tests.agents.conftest import serving
from tests.agents.test_node_health import node

AT = datetime(2026, 11, 28, 10, 0, tzinfo=UTC)
VM = "gpu_3"


def raw(kind: str = "Reboot", minutes: float = 10, vm: str = VM, **more: Any) -> dict[str, Any]:
    return {
        "EventId": f"E-{kind}",
        "EventType": kind,
        "ResourceType": "VirtualMachine",
        "Resources": [vm],
        "EventStatus": "Scheduled",
        "NotBefore": (AT + timedelta(minutes=minutes)).strftime("%a, %d %b %Y %H:%M:%S GMT"),
        "Description": "Host server is undergoing maintenance.",
        "EventSource": "Platform",
        "DurationInSeconds": -1,
        **more,
    }


def judged(
    *events: dict[str, Any], lead_s: float = se.LEAD_S
) -> tuple[list[gpu_probe.Finding], list[str], list[str], list[str]]:
    """(findings, the due events an agent would approve once drained, log lines, ignored reasons)."""
    _, parsed, bad = se.parse({"DocumentIncarnation": 3, "Events": list(events)})
    j = se.judge(parsed, VM, AT, lead_s, malformed=len(bad))
    return j.findings, [e.id for e in j.due if se.approvable(e, VM)], bad + j.lines, j.ignored


@pytest.mark.parametrize("kind", se.DRAINED_FIRST)
def test_a_reboot_redeploy_or_terminate_for_this_vm_is_maintenance_within_the_lead(kind: str) -> None:
    found, ack, _, ignored = judged(raw(kind, minutes=10))
    assert [f.level for f in found] == ["maintenance"] and ack == [f"E-{kind}"] and ignored == []
    assert f"Platform {kind} not before 2026-11-28 10:10:00 UTC (event E-{kind})" in found[0].reason


def test_maintenance_is_never_a_failure_whatever_else_the_node_reports() -> None:
    (finding,), _, _, _ = judged(raw("Reboot", minutes=10))
    healthy = gpu_probe.Verdict("gpu-3", "healthy", [])
    assert nh.combined(healthy, [finding]).level == "maintenance"
    warned = gpu_probe.Verdict("gpu-3", "warning", [gpu_probe.Finding("warning", 2, "temperature 87 C")])
    assert nh.combined(warned, [finding]).level == "maintenance"
    broken = gpu_probe.Verdict(
        "gpu-3", "fatal", [gpu_probe.Finding("fatal", 2, "Xid 79: fallen off the bus")]
    )
    assert nh.combined(broken, [finding]).level == "fatal"  # a failure stays a failure


def test_the_earliest_not_before_of_the_due_events_is_when_the_maintenance_starts() -> None:
    _, parsed, _ = se.parse(
        {"Events": [raw("Reboot", minutes=12), {**raw("Redeploy", minutes=4), "EventId": "R"}]}
    )
    assert se.judge(parsed, VM, AT).starts_at == "2026-11-28T10:04:00Z"
    _, parsed, _ = se.parse({"Events": [raw("Reboot", EventStatus="Started", NotBefore="")]})
    assert se.judge(parsed, VM, AT).starts_at == "started"
    _, parsed, _ = se.parse({"Events": [raw("Reboot", minutes=3 * 24 * 60)]})
    assert se.judge(parsed, VM, AT).starts_at == ""  # days ahead: not due, nothing starts


def test_an_event_that_names_other_vms_too_is_drained_for_but_never_approved() -> None:
    """Approving starts an event on every VM it names: this node's drain does not speak for theirs."""
    found, ack, _, _ = judged(raw("Reboot", minutes=10, Resources=[VM, "gpu_4"]))
    assert [f.level for f in found] == ["maintenance"] and ack == []


def test_an_event_days_ahead_is_a_warning_until_its_lead() -> None:
    found, ack, _, _ = judged(raw("Redeploy", minutes=3 * 24 * 60))
    assert [f.level for f in found] == ["warning"] and ack == []


def test_a_started_event_is_maintenance_and_not_approved_again() -> None:
    found, ack, _, _ = judged(raw("Reboot", EventStatus="Started", NotBefore=""))
    assert [f.level for f in found] == ["maintenance"] and ack == []


def test_a_short_freeze_and_a_preempt_are_logged_only_a_long_freeze_is_maintenance() -> None:
    found, ack, lines, ignored = judged(raw("Freeze", DurationInSeconds=9), raw("Preempt"))
    assert found == [] and ack == [] and len(lines) == 2 and ignored == ["preempt"]
    found, ack, _, _ = judged(raw("Freeze", DurationInSeconds=120))
    assert [f.level for f in found] == ["maintenance"] and ack == ["E-Freeze"]
    assert found[0].reason.endswith("of 120 s")


def test_another_vms_event_an_unknown_type_or_a_malformed_event_never_cordons() -> None:
    found, ack, lines, ignored = judged(
        raw("Reboot", vm="gpu_4"),
        raw("Hibernate"),
        {"EventId": "x"},
        raw("Reboot", NotBefore="tomorrow-ish"),
        raw("Redeploy", NotBefore=""),  # Scheduled, but no time to drain by
        raw("Freeze"),  # DurationInSeconds -1: a pause of unknown length
    )
    assert found == [] and ack == []
    assert sorted(ignored) == sorted(
        ["other-vm", "unknown-type", "malformed", "malformed", "no-not-before", "freeze-unknown-length"]
    )
    assert set(ignored) <= set(se.IGNORED)
    assert any("gpu_4" in line for line in lines) and any("unknown event type" in line for line in lines)
    assert any("no EventType" in line for line in lines) and any("not an HTTP date" in line for line in lines)
    with pytest.raises(se.EventsError):
        se.parse(["not", "a", "document"])


# --- against the lab's metadata service --------------------------------------------------------


@pytest.fixture
def metadata(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """The lab's metadata service on loopback, knowing 127.0.0.1 as the VM `VM` of host `gpu-3`."""
    doc = imds.document(name=VM, scale_set="gpu", location="eastus", vm_size="Standard_ND96isr_H100_v5",
                        tags={}, primary="127.0.0.1", secondary=[], prefixlen=8, mac="00:00:00:00:00:01")  # fmt: skip
    docs = tmp_path / "imds.json"
    docs.write_text("{}")
    events = docs.with_name(imds.EVENTS)
    with serving(ThreadingHTTPServer(("127.0.0.1", 0), imds.handler(lambda source: doc, events))) as url:
        yield url, events


def test_the_client_reads_its_vm_and_its_events_and_approves_them(metadata: tuple[str, Path]) -> None:
    base, events = metadata
    client = se.Client(base)
    assert client.vm_name() == VM
    assert se.parse(client.document()) == (0, [], [])
    added = imds.add_event(events, VM, VM, "Terminate", 600)
    incarnation, (event,), _ = se.parse(client.document())
    assert incarnation == 1 and event.id == added["EventId"] and event.status == "Scheduled"
    assert (
        event.not_before is not None and 590 < (event.not_before - datetime.now(UTC)).total_seconds() <= 600
    )
    client.acknowledge([event.id])
    incarnation, (event,), _ = se.parse(client.document())
    assert (incarnation, event.status, event.not_before) == (2, "Started", None)
    assert "approved_at" not in client.document()["Events"][0]  # the lab's own key is never served
    assert imds.events_of(events, VM)[0]["approved_at"]


def test_a_request_without_the_metadata_header_is_refused_as_azure_does(metadata: tuple[str, Path]) -> None:
    import urllib.error
    import urllib.request

    base, _ = metadata
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(f"{base}{se.PATH}?api-version={se.API_VERSION}", timeout=5)
    assert e.value.code == 400
    e.value.close()


class Kube:
    def __init__(self) -> None:
        self.patches: list[Any] = []
        self.events: list[Any] = []

    def patch_node(self, name: str, body: Any) -> None:
        self.patches.append(body)

    def create_event(self, body: Any) -> None:
        self.events.append(body)


def agent_on(base: str, kube: Kube | None = None, me: dict[str, Any] | None = None) -> nh.Agent:
    """The CPU node cpu-3's health agent, its GPUs none and its events from `base`."""
    mine = me if me is not None else node("cpu-3")
    return nh.Agent("cpu-3", "cpu", lambda: gpu_probe.Verdict("cpu-3", "healthy", []), kube or Kube(),
                    lambda: mine, events=nh.Events(se.Client(base, timeout=1)))  # fmt: skip


def test_the_agent_reports_maintenance_approves_it_only_once_drained_and_reports_healthy_after(
    metadata: tuple[str, Path],
) -> None:
    base, events = metadata
    imds.add_event(events, VM, VM, "Reboot", 15 * 60)
    me = node("cpu-3")
    kube = Kube()
    agent = agent_on(base, kube, me)
    value = agent.round()
    assert value.startswith("maintenance: node: scheduled Platform Reboot not before")
    assert nh.cordon_reason(value) == "MaintenanceCordon"
    (report,) = kube.patches
    starts = report["metadata"]["annotations"][nh.MAINTENANCE_AT]
    assert (
        14 * 60
        < (
            datetime.strptime(starts, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC) - datetime.now(UTC)
        ).total_seconds()
        <= 15 * 60
    )
    assert imds.events_of(events, VM)[0]["EventStatus"] == "Scheduled"  # not drained yet: not approved
    # cordoned by the controller for maintenance
    notes = me["metadata"]["annotations"]
    notes.update({**nh.cordon_patch(value, datetime(2026, 11, 28, 10, tzinfo=UTC), "maintenance")["metadata"]["annotations"],
                  nh.VERDICT_ANNOTATION: value})  # fmt: skip
    me["spec"]["unschedulable"] = True
    notes[nh.DRAINED_AT] = "2026-11-28T09:59:00Z"  # a mark from an earlier cordon is not this drain
    agent.round()
    assert imds.events_of(events, VM)[0]["EventStatus"] == "Scheduled"
    notes[nh.DRAINED_AT] = "2026-11-28T10:00:30Z"
    agent.round()
    (event,) = imds.events_of(events, VM)
    assert event["EventStatus"] == "Started" and event["approved_at"]
    assert [e["reason"] for e in kube.events] == ["ScheduledEventApproved"]
    agent.round()  # approved once
    assert [e["reason"] for e in kube.events] == ["ScheduledEventApproved"]
    assert agent.metrics.acknowledged.labels("Reboot")._value.get() == 1
    # the VM is back: the event has left the document, and the node is reported healthy
    imds.clear_events(events, VM)
    notes[nh.VERDICT_ANNOTATION] = agent.round()
    assert notes[nh.VERDICT_ANNOTATION] == "healthy"
    assert kube.patches[-1]["metadata"]["annotations"][nh.MAINTENANCE_AT] is None


def test_events_it_cannot_act_on_are_counted_once_per_document(metadata: tuple[str, Path]) -> None:
    base, events = metadata
    imds.add_event(events, VM, "gpu_4", "Reboot", 15 * 60)  # another VM's
    agent = agent_on(base)
    assert agent.round() == agent.round() == "healthy"
    assert agent.metrics.ignored.labels("other-vm")._value.get() == 1


def test_without_the_metadata_service_the_agent_goes_on_and_says_so() -> None:
    agent = agent_on("http://127.0.0.1:9")
    assert agent.round() == "healthy"
    assert agent.metrics.events_up._value.get() == 0


def test_a_document_that_cannot_be_read_is_not_a_maintenance_over(metadata: tuple[str, Path]) -> None:
    """The metadata service away for a round: the last document's maintenance holds (for the lead),
    so the controller does not return a node whose Reboot is still to come."""
    base, events = metadata
    imds.add_event(events, VM, VM, "Reboot", 15 * 60)
    agent = agent_on(base)
    assert agent.round().startswith("maintenance: ")
    assert agent.events is not None
    agent.events.client = se.Client("http://127.0.0.1:9", timeout=1)
    assert agent.round().startswith("maintenance: ") and agent.metrics.events_up._value.get() == 0
    agent.events.last_at -= agent.events.lead_s  # unread for longer than the lead: nothing is kept
    assert agent.round() == "healthy"


def test_a_verdict_older_than_the_cordon_is_said_again(metadata: tuple[str, Path]) -> None:
    """The controller returns a node only on a verdict made since its cordon: a `healthy` stamped just
    before a cordon landed would otherwise never count, and the node stay cordoned."""
    base, _ = metadata
    me = node("cpu-3")
    kube = Kube()
    agent = agent_on(base, kube, me)
    notes = me["metadata"]["annotations"]
    notes.update({nh.VERDICT_ANNOTATION: "healthy", nh.VERDICT_AT: "2026-11-28T10:00:00Z"})
    notes.update(nh.cordon_patch("maintenance: node: ...", datetime(2026, 11, 28, 10, 0, 1, tzinfo=UTC),
                                 "maintenance")["metadata"]["annotations"])  # fmt: skip
    me["spec"]["unschedulable"] = True
    assert agent.round() == "healthy" and len(kube.patches) == 1  # said again, with a new time
    notes[nh.VERDICT_AT] = kube.patches[0]["metadata"]["annotations"][nh.VERDICT_AT]
    agent.round()
    assert len(kube.patches) == 1  # not again once it is newer than the cordon
