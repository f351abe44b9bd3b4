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
) -> tuple[list[gpu_probe.Finding], list[str], list[str]]:
    _, parsed, bad = se.parse({"DocumentIncarnation": 3, "Events": list(events)})
    found, ack, lines = se.findings(parsed, VM, AT, lead_s)
    return found, [e.id for e in ack], bad + lines


@pytest.mark.parametrize("kind", se.DRAINED_FIRST)
def test_a_reboot_redeploy_or_terminate_for_this_vm_is_fatal_within_the_lead(kind: str) -> None:
    found, ack, _ = judged(raw(kind, minutes=10))
    assert [f.level for f in found] == ["fatal"] and ack == [f"E-{kind}"]
    assert f"Platform {kind} not before 2026-11-28 10:10:00 UTC (event E-{kind})" in found[0].reason


def test_an_event_days_ahead_is_a_warning_until_its_lead() -> None:
    found, ack, _ = judged(raw("Redeploy", minutes=3 * 24 * 60))
    assert [f.level for f in found] == ["warning"] and ack == []


def test_a_started_event_is_fatal_and_not_approved_again() -> None:
    found, ack, _ = judged(raw("Reboot", EventStatus="Started", NotBefore=""))
    assert [f.level for f in found] == ["fatal"] and ack == []


def test_a_short_freeze_and_a_preempt_are_logged_only_a_long_freeze_warns() -> None:
    found, ack, lines = judged(raw("Freeze", DurationInSeconds=9), raw("Preempt"))
    assert found == [] and ack == [] and len(lines) == 2
    found, _, _ = judged(raw("Freeze", DurationInSeconds=120))
    assert [f.level for f in found] == ["warning"]


def test_another_vms_event_an_unknown_type_or_a_malformed_event_never_cordons() -> None:
    found, ack, lines = judged(
        raw("Reboot", vm="gpu_4"),
        raw("Hibernate"),
        {"EventId": "x"},
        raw("Reboot", NotBefore="tomorrow-ish"),
    )
    assert found == [] and ack == []
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


def test_the_agent_reports_the_event_and_approves_it_only_once_drained(metadata: tuple[str, Path]) -> None:
    base, events = metadata
    imds.add_event(events, VM, VM, "Reboot", 15 * 60)
    me = node("cpu-3")
    kube = Kube()
    agent = nh.Agent(
        "cpu-3", "cpu", lambda: gpu_probe.Verdict("cpu-3", "healthy", []), kube, lambda: me,
        events=nh.Events(se.Client(base)),
    )  # fmt: skip
    value = agent.round()
    assert value.startswith("fatal: node: scheduled Platform Reboot not before")
    assert nh.cordon_reason(value) == "ScheduledEventCordon"
    assert imds.events_of(events, VM)[0]["EventStatus"] == "Scheduled"  # not drained yet: not approved
    # cordoned by the controller, then drained
    notes = me["metadata"]["annotations"]
    notes.update(
        {nh.ANNOTATION: value, nh.ANNOTATION_AT: "2026-11-28T10:00:00Z", nh.VERDICT_ANNOTATION: value}
    )
    me["spec"]["unschedulable"] = True
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


def test_without_the_metadata_service_the_agent_goes_on_and_says_so() -> None:
    agent = nh.Agent(
        "cpu-3", "cpu", lambda: gpu_probe.Verdict("cpu-3", "healthy", []), Kube(), lambda: node("cpu-3"),
        events=nh.Events(se.Client("http://127.0.0.1:9", timeout=1)),
    )  # fmt: skip
    assert agent.round() == "healthy"
    assert agent.metrics.events_up._value.get() == 0
