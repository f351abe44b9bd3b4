"""Azure Scheduled Events: the maintenance Azure has scheduled for this VM, read from its own instance
metadata, and acknowledged once the node is drained so Azure proceeds at once.

Azure's document (Scheduled Events for Linux VMs,
https://learn.microsoft.com/azure/virtual-machines/linux/scheduled-events, api-version 2020-07-01):
`GET http://169.254.169.254/metadata/scheduledevents?api-version=2020-07-01` with the header
`Metadata: true` answers

    {"DocumentIncarnation": 2, "Events": [{"EventId": "...", "EventType": "Reboot",
      "ResourceType": "VirtualMachine", "Resources": ["gpu_3"], "EventStatus": "Scheduled",
      "NotBefore": "Mon, 19 Sep 2016 18:29:47 GMT", "Description": "...",
      "EventSource": "Platform", "DurationInSeconds": -1}]}

- EventType: Freeze (the VM paused for seconds), Reboot, Redeploy (moved to another host),
  Preempt (Spot eviction), Terminate (the VM deleted; scale sets opt in to this notice with
  `scheduledEventsProfile.terminateNotificationProfile`, a not-before timeout of 5 to 15 minutes,
  https://learn.microsoft.com/azure/virtual-machine-scale-sets/virtual-machine-scale-sets-terminate-notification).
- EventStatus: Scheduled (NotBefore is when it will start unless approved), then Started (NotBefore
  empty). An event Azure cancels leaves the list.
- Minimum notice, by type: Freeze and Reboot 15 minutes, Redeploy 10; Preempt 30 seconds;
  Terminate the scale set's timeout. There is no Completed status: an event that is over is no
  longer in the document. A migration for predicted hardware failure may come days ahead.
- Resources names the VMs the event affects: every VM of a scale set's placement group sees the
  document, so an event counts only when it names this VM (`compute.name` in its instance metadata).
- Approving: `POST` the same URL with `{"StartRequests": [{"EventId": "..."}]}`. An approval lets
  the event proceed for every VM in its Resources, not only the one that approved it.

What each type means (that page's table): Freeze pauses the VM for seconds (memory and open files
kept); Reboot restarts it (non-persistent memory lost); Redeploy moves it to another host
(ephemeral disks lost); Preempt deletes a Spot VM; Terminate deletes the VM. All but Terminate end
with the same VM back, so none of them is a failure.

What superkube does with them (`judge`): a Reboot, Redeploy or Terminate for this VM, or a Freeze
longer than `FREEZE_LOG_ONLY_S`, is maintenance once it is less than `lead` away (or Started): the
health controller cordons the node as maintenance (never as a failure, so remediation never
deletes its VM) and drains it; the agent approves the event once the drain since that cordon is
done, and only an event for this VM alone (`approvable`: approving one that names other VMs would
start it on them, drained or not; those start at NotBefore); once the event has left the document the agent reports the node healthy again and the
controller uncordons it. A Terminate's VM does not come back. Further ahead an event is a warning
(jobs keep the node until the lead). A Freeze of at most 30 s is logged only. Anything the agent
cannot act on safely is a log line and a count in `ignored` by reason, never a cordon: a malformed
event, an unknown type, another VM's event, a Scheduled event with no NotBefore, a Freeze of
unknown length (DurationInSeconds -1), a Preempt (no pool is Spot).
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any

from superkube.agents.gpu_probe import Finding
from superkube.cluster.kube import IMDS

PATH = "/metadata/scheduledevents"
API_VERSION = "2020-07-01"
DRAINED_FIRST = ("Reboot", "Redeploy", "Terminate")
KNOWN = (*DRAINED_FIRST, "Freeze", "Preempt")
FREEZE_LOG_ONLY_S = 30
LEAD_S = 20 * 60  # Reboot and Freeze come at least 15 minutes ahead, Redeploy 10; Terminate 5 to 15


class EventsError(Exception):
    """The document could not be had or read; the message says why."""


@dataclass(frozen=True)
class Event:
    id: str
    type: str
    status: str
    resources: tuple[str, ...]
    not_before: datetime | None  # None: Started, or none given
    source: str
    duration_s: int

    def __str__(self) -> str:
        when = f"not before {self.not_before:%Y-%m-%d %H:%M:%S} UTC" if self.not_before else self.status
        return f"{self.source or 'Azure'} {self.type} {when} (event {self.id})"


def parse(doc: Any) -> tuple[int, list[Event], list[str]]:
    """(DocumentIncarnation, the events, a line for each event that could not be read)."""
    if not isinstance(doc, Mapping) or not isinstance(doc.get("Events", []), list):
        raise EventsError("the scheduled events document is not an object with an Events list")
    incarnation = doc.get("DocumentIncarnation", 0)
    events, bad = [], []
    for i, raw in enumerate(doc.get("Events") or []):
        try:
            events.append(_event(raw))
        except (KeyError, TypeError, ValueError) as e:
            bad.append(f"Events[{i}]: {e}")
    return int(incarnation) if isinstance(incarnation, int) else 0, events, bad


def _event(raw: Mapping[str, Any]) -> Event:
    if not isinstance(raw, Mapping):
        raise TypeError("not an object")
    for key in ("EventId", "EventType", "EventStatus", "Resources"):
        if key not in raw:
            raise KeyError(f"no {key}")
    resources = raw["Resources"]
    if not isinstance(resources, list) or not all(isinstance(r, str) for r in resources):
        raise TypeError("Resources is not a list of names")
    text = str(raw.get("NotBefore") or "").strip()
    not_before = None
    if text:
        try:
            not_before = parsedate_to_datetime(text).astimezone(UTC)
        except (TypeError, ValueError):
            raise ValueError(f"NotBefore {text!r} is not an HTTP date") from None
    return Event(
        id=str(raw["EventId"]),
        type=str(raw["EventType"]),
        status=str(raw["EventStatus"]),
        resources=tuple(resources),
        not_before=not_before,
        source=str(raw.get("EventSource", "")),
        duration_s=int(raw.get("DurationInSeconds", -1) or -1),
    )


def approvable(event: Event, vm: str) -> bool:
    """May this VM's agent approve the event once its node is drained: still Scheduled, and for this
    VM alone (an approval starts it for every VM it names)."""
    return event.status == "Scheduled" and event.resources == (vm,)


@dataclass
class Judgement:
    """One document judged for one VM at one time."""

    findings: list[Finding] = field(default_factory=list)
    due: list[Event] = field(default_factory=list)  # maintenance within the lead, to approve once drained
    lines: list[str] = field(default_factory=list)  # what to log
    ignored: list[str] = field(default_factory=list)  # a reason per event not acted on (IGNORED)

    @property
    def starts_at(self) -> str:
        """The earliest NotBefore of the due events as a stamp, "started" if one has started, "" if none."""
        if any(e.not_before is None for e in self.due):
            return "started"
        times = sorted(e.not_before for e in self.due if e.not_before is not None)
        return times[0].strftime("%Y-%m-%dT%H:%M:%SZ") if times else ""


IGNORED = ("malformed", "unknown-type", "other-vm", "no-not-before", "freeze-unknown-length", "preempt")
"""Why an event was not acted on: the label of the agent's count of them."""


def judge(
    events: Iterable[Event], vm: str, at: datetime, lead_s: float = LEAD_S, malformed: int = 0
) -> Judgement:
    """What this VM's agent reports for the document's events at `at` (`malformed`: how many could
    not be read at all, each counted)."""
    j = Judgement(ignored=["malformed"] * malformed)

    def ignore(reason: str, line: str) -> None:
        j.ignored.append(reason)
        j.lines.append(f"ignored: {line}")

    for e in events:
        if vm not in e.resources:
            ignore("other-vm", f"{e} is for {', '.join(e.resources) or 'no VM'}, not {vm}")
            continue
        if e.type not in KNOWN:
            ignore("unknown-type", f"{e}: unknown event type")
            continue
        if e.type == "Preempt":
            ignore("preempt", f"{e}: Spot eviction, which no pool uses")
            continue
        if e.status == "Scheduled" and e.not_before is None:
            ignore("no-not-before", f"{e}: Scheduled with no NotBefore, so no time to drain by")
            continue
        if e.type == "Freeze":
            if e.duration_s < 0:
                ignore("freeze-unknown-length", f"{e}: a pause of unknown length")
                continue
            if e.duration_s <= FREEZE_LOG_ONLY_S:
                j.lines.append(f"{e}: a pause of {e.duration_s} s, logged only")
                continue
        due = e.not_before is None or (e.not_before - at).total_seconds() <= lead_s
        what = f"scheduled {e}" + (f" of {e.duration_s} s" if e.type == "Freeze" else "")
        j.findings.append(Finding("maintenance" if due else "warning", None, what))
        if due:
            j.due.append(e)
    return j


def _request(url: str, body: bytes | None, timeout: float) -> Any:
    headers = {"Metadata": "true", **({"Content-Type": "application/json"} if body else {})}
    request = urllib.request.Request(url, data=body, headers=headers, method="POST" if body else "GET")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            data = response.read()
    except urllib.error.HTTPError as e:
        raise EventsError(f"{url}: HTTP {e.code} {e.reason}") from None
    except (urllib.error.URLError, OSError) as e:
        raise EventsError(f"{url}: {getattr(e, 'reason', e)}") from None
    if body is not None:
        return None
    try:
        return json.loads(data)
    except ValueError:
        raise EventsError(f"{url}: the answer is not JSON ({data[:60]!r})") from None


@dataclass
class Client:
    """This VM's scheduled events and its name, from its instance metadata."""

    base: str = IMDS
    timeout: float = 5.0

    @property
    def url(self) -> str:
        return f"{self.base}{PATH}?api-version={API_VERSION}"

    def document(self) -> Any:
        return _request(self.url, None, self.timeout)

    def vm_name(self) -> str:
        url = f"{self.base}/metadata/instance/compute/name?api-version=2021-02-01&format=text"
        request = urllib.request.Request(url, headers={"Metadata": "true"})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as r:
                name = r.read().decode().strip().strip('"')
        except (urllib.error.URLError, OSError) as e:
            raise EventsError(f"{url}: {getattr(e, 'reason', e)}") from None
        if not name:
            raise EventsError(f"{url}: no VM name")
        return name

    def acknowledge(self, ids: Iterable[str]) -> None:
        body = json.dumps({"StartRequests": [{"EventId": i} for i in ids]}).encode()
        _request(self.url, body, self.timeout)
