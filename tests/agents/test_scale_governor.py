"""The scale-up governor's decisions, and its bound against an autoscaler that takes every node it may.

The status text is the shape cluster-autoscaler 1.35.2 writes (the reading beside this file was
taken from the real autoscaler in the lab's scale-up benchmark). The bound is checked by simulation:
an autoscaler that sees max sizes only at its provider's refresh and then asks for any part of the
room it sees, at any second, against the governor's rounds at their own cadence."""

from __future__ import annotations

import json
import random
from collections.abc import Mapping
from pathlib import Path
from typing import cast

import pytest
import yaml

from modules.platform import autoscaler as autoscaler_rbac
from superkube.agents import scale_governor as gov
from superkube.cluster import autoscaling
from superkube.harness import apiserver
from superkube.harness import autoscaler as ca_lab
from superkube.harness.apiserver import LocalApi
from superkube.plan.engine import Plan
from tests.agents.conftest import apply

READING = Path(__file__).parent / "readings" / "cluster-autoscaler-status-1.35.2.yaml"


def group(name: str, target: int, max_seen: int, unready: int = 0, long_unregistered: int = 0) -> gov.Group:
    return gov.Group(name, target, max_seen, target, unready, long_unregistered)


def test_the_status_the_real_autoscaler_wrote_reads_as_its_groups() -> None:
    groups = gov.parse_status(READING.read_text())
    raw = yaml.safe_load(READING.read_text())["nodeGroups"]
    assert [g.name for g in groups] == [g["name"] for g in raw] and groups
    for g, r in zip(groups, raw, strict=True):
        assert g.target == r["health"]["cloudProviderTarget"]
        assert g.max_seen == r["health"]["maxSize"]
        assert g.registered == r["health"]["nodeCounts"]["registered"]["total"]


@pytest.mark.parametrize(
    "text", ["nodeGroups: [{name: a}]", "nodeGroups: [{name: a, health: {maxSize: x}}]", "- ["]
)
def test_a_status_of_another_shape_is_an_error_not_a_guess(text: str) -> None:
    with pytest.raises(gov.StatusError, match="nodeGroups"):
        gov.parse_status(text)


def test_the_budget_splits_the_safe_rate_over_the_refreshes_a_minute_touches() -> None:
    assert gov.budget(300, 60) == 150  # Azure's one-minute refresh: a minute touches two
    assert gov.budget(300, 30) == 100
    assert gov.budget(300, 10) == 42  # seven refreshes: 300 // 7


def test_the_room_goes_to_the_groups_the_autoscaler_filled() -> None:
    ceilings = {"a": 900, "b": 900, "c": 900}
    maxes = gov.decide([group("a", 40, 40), group("b", 10, 30), group("c", 40, 40)], ceilings, 100, 50)
    assert maxes == {"a": 90, "b": 10, "c": 90}  # b was not full: its unused room closes


def test_with_none_full_every_group_gets_an_even_share() -> None:
    maxes = gov.decide([group(n, 0, 10) for n in "abc"], dict.fromkeys("abc", 900), 100, 50)
    assert sorted(maxes.values()) == [33, 33, 34] and sum(maxes.values()) == 100


def test_no_group_passes_its_ceiling_and_what_it_cannot_take_goes_to_the_others() -> None:
    maxes = gov.decide([group("a", 95, 95), group("b", 0, 10)], {"a": 100, "b": 900}, 100, 50)
    assert maxes == {"a": 100, "b": 95}


def test_a_group_that_took_its_room_gets_all_of_it_and_idle_groups_none() -> None:
    ceilings = dict.fromkeys("abc", 900)
    g = gov.Governor(lambda: None, Recorder(), ceilings, 300, 50)
    g.plan([group("a", 10, 30), group("b", 5, 5), group("c", 5, 5)])
    # a grew into the max it sees; b and c sit at theirs (closed, not wanting): all 150 go to a
    assert g.plan([group("a", 30, 30), group("b", 5, 5), group("c", 5, 5)]) == {"a": 180, "b": 5, "c": 5}
    # sitting below the max it sees without growing, it stops wanting: the room is shared again
    assert g.plan([group("a", 30, 180), group("b", 5, 5), group("c", 5, 5)]) == {"a": 80, "b": 55, "c": 55}
    # growing again (into the room it still sees), it takes it all
    assert g.plan([group("a", 100, 180), group("b", 5, 5), group("c", 5, 5)]) == {"a": 250, "b": 5, "c": 5}


def test_a_max_is_never_set_under_the_groups_min() -> None:
    floor = gov.Group("cpu", 0, 16, 0, 0, 0, min_size=16)
    assert gov.decide([floor], {"cpu": 64}, 0, 50) == {"cpu": 16}
    assert gov.initial_maxes({"cpu": 64, "gpu": 900}, {}, 10, {"cpu": 16}) == {"cpu": 16, "gpu": 5}


def test_no_room_while_too_many_nodes_are_not_joining() -> None:
    groups = [group("a", 60, 60, unready=30), group("b", 60, 60, long_unregistered=21)]
    assert gov.decide(groups, {"a": 900, "b": 900}, 100, 50) == {"a": 60, "b": 60}
    assert gov.decide(groups, {"a": 900, "b": 900}, 100, 51) == {"a": 110, "b": 110}


def test_a_max_is_never_set_under_the_target_and_ungoverned_groups_are_left_alone() -> None:
    maxes = gov.decide([group("a", 120, 150), group("cpu", 3, 3)], {"a": 100}, 100, 50)
    assert maxes == {"a": 120}


class Recorder:
    def __init__(self) -> None:
        self.writes: list[dict[str, int]] = []

    def set_max(self, sizes: Mapping[str, int]) -> None:
        self.writes.append(dict(sizes))


def status(groups: list[gov.Group]) -> str:
    return yaml.safe_dump({"nodeGroups": [
        {"name": g.name, "health": {"cloudProviderTarget": g.target, "maxSize": g.max_seen,
                                    "nodeCounts": {"registered": {"total": g.registered, "ready": g.registered}}}}
        for g in groups
    ]})  # fmt: skip


def test_a_round_writes_only_the_maxes_that_change() -> None:
    seen = [[group("a", 0, 900), group("b", 0, 900)]]
    sizes = Recorder()
    g = gov.Governor(lambda: status(seen[0]), sizes, {"a": 900, "b": 900}, 300, 50)
    g.once()
    assert sizes.writes == [{"a": 75}, {"b": 75}]  # one set at a time
    g.once()
    assert len(sizes.writes) == 2  # nothing moved
    seen[0] = [group("a", 75, 75), group("b", 0, 75)]
    g.once()
    assert sizes.writes[2:] == [{"b": 0}, {"a": 225}]  # the lower first


def test_a_tag_someone_else_set_is_written_again_once_the_autoscaler_shows_it() -> None:
    """A `pulumi up` that updates a scale set puts back the max tag it stored. Once the autoscaler
    has had a refresh and two rounds to see the governor's write and shows another max, the
    governor writes its own again; before that, a differing max is only a refresh not yet taken."""
    now = [0.0]
    seen = [[group("a", 10, 900)]]
    sizes = Recorder()
    g = gov.Governor(lambda: status(seen[0]), sizes, {"a": 900}, 300, 50, clock=lambda: now[0])
    g.once()
    assert sizes.writes == [{"a": 160}]
    seen[0] = [group("a", 10, 900)]  # the refresh has not come yet
    now[0] = 30.0
    g.once()
    assert len(sizes.writes) == 1
    now[0] = 81.0  # past 60 s + two 10 s rounds: the autoscaler still sees 900
    g.once()
    assert sizes.writes[1:] == [{"a": 160}]


def test_a_governor_that_takes_the_lead_writes_every_max_once() -> None:
    """What the status shows may be older than what the last holder wrote: the first round after
    starting or taking the lead writes each max, even one the status already shows."""
    sizes = Recorder()
    g = gov.Governor(lambda: status([group("a", 10, 160)]), sizes, {"a": 900}, 300, 50)
    g.once()
    assert sizes.writes == [{"a": 160}]
    g.once()
    assert len(sizes.writes) == 1
    g.forget()
    g.once()
    assert sizes.writes[1:] == [{"a": 160}]


def test_a_round_before_the_autoscaler_reported_does_nothing() -> None:
    sizes = Recorder()
    assert gov.Governor(lambda: None, sizes, {"a": 9}, 300, 50).once() is None and sizes.writes == []


class Refusing(Recorder):
    """Azure's tags as a writer that refuses the scale sets named in `refuse` (HTTP 409)."""

    def __init__(self) -> None:
        super().__init__()
        self.refuse: set[str] = set()

    def set_max(self, sizes: Mapping[str, int]) -> None:
        if set(sizes) & self.refuse:
            raise gov.ServiceError(f"setting max on scale set {', '.join(sizes)}: HTTP 409 Conflict")
        super().set_max(sizes)


def test_the_metrics_count_each_write_and_show_the_room_each_set_was_given() -> None:
    """Writes counted as they land or are refused, one each; the room gauges are the last whole
    round's max less target, per scale set; none while nodes are not joining."""
    seen = [status([group("a", 0, 900), group("b", 0, 900)])]
    sizes = Refusing()
    g = gov.Governor(lambda: seen[0], sizes, {"a": 900, "b": 900}, 300, 50)
    m = g.metrics

    def writes() -> tuple[float | None, float | None]:
        return (m.value("superkube_scale_governor_writes_total", result="written"),
                m.value("superkube_scale_governor_writes_total", result="refused"))  # fmt: skip

    def room() -> dict[str, float | None]:
        return {n: m.value("superkube_scale_governor_room_nodes", scale_set=n) for n in ("a", "b")}

    assert m.value("superkube_scale_governor_budget_nodes") == 150 and writes() == (0, 0)
    g.once()
    assert writes() == (2, 0) and room() == {"a": 75, "b": 75}
    assert m.value("superkube_scale_governor_held") == 0
    seen[0] = status([group("a", 75, 75), group("b", 0, 75)])  # a grew: the room moves to it
    sizes.refuse = {"a"}  # b's lower lands, a's raise is refused
    with pytest.raises(gov.ServiceError, match="HTTP 409"):
        g.once()
    assert writes() == (3, 1) and room() == {"a": 75, "b": 75}  # the round did not finish
    sizes.refuse.clear()
    g.once()
    assert writes() == (4, 1) and room() == {"a": 150, "b": 0}
    # 60 nodes unready, past the bound of 50: no room, and the gauge says why
    seen[0] = yaml.safe_dump({"nodeGroups": [
        {"name": "a", "health": {"cloudProviderTarget": 75, "maxSize": 225,
                                 "nodeCounts": {"registered": {"total": 75, "unready": {"total": 60}}}}},
        {"name": "b", "health": {"cloudProviderTarget": 0, "maxSize": 0, "nodeCounts": {}}},
    ]})  # fmt: skip
    g.once()
    assert m.value("superkube_scale_governor_held") == 1 and room() == {"a": 0, "b": 0}
    assert writes() == (5, 1) and sizes.writes[-1] == {"a": 75}


class Lead:
    """The API server on a governor's host, as `serve` reads it: the autoscaler's lease holder."""

    def __init__(self, holder: str | None) -> None:
        self.holder: str | None = holder
        self.down = False

    def leader(self) -> str | None:
        if self.down:
            raise gov.ServiceError("GET /apis/coordination.k8s.io/v1/...: connection refused")
        return self.holder

    def status(self) -> str:
        return status([group("a", 0, 900)])


def test_the_leader_gauge_is_one_only_while_this_hosts_autoscaler_leads() -> None:
    g = gov.Governor(lambda: None, Recorder(), {"a": 900}, 300, 50)
    lead = Lead("apiserver-2")
    g.read_status = gov.serve(g, cast(gov.KubeReader, lead), "apiserver-1")
    assert g.once() is None and g.metrics.value("superkube_scale_governor_leader") == 0
    lead.holder = "apiserver-1"
    assert g.once() is not None and g.metrics.value("superkube_scale_governor_leader") == 1
    assert g.metrics.value("superkube_scale_governor_room_nodes", scale_set="a") == 150
    lead.down = True  # its API server cannot say who leads: it does not act
    with pytest.raises(gov.ServiceError):
        g.once()
    assert g.metrics.value("superkube_scale_governor_leader") == 0
    lead.down, lead.holder = False, "apiserver-3"
    assert g.once() is None and g.metrics.value("superkube_scale_governor_leader") == 0
    # the room is the acting governor's to say: this one's is gone once it stands by
    assert g.metrics.value("superkube_scale_governor_room_nodes", scale_set="a") is None


def test_the_rounds_counter_counts_what_each_acting_round_came_to() -> None:
    texts = [None, status([group("a", 0, 900)]), "- [", status([group("a", 0, 900)])]
    g = gov.Governor(lambda: None, Recorder(), {"a": 900}, 300, 50, interval=0)

    def read() -> str | None:
        if len(texts) == 1:
            g.stop.set()  # the last round
        return texts.pop(0)

    g.read_status = read
    g.run()
    rounds = {r: g.metrics.value("superkube_scale_governor_rounds_total", result=r) for r in ("ok", "failed")}
    assert rounds == {"ok": 2, "failed": 1}  # a round with no status to read (standing by) is none


def simulate(
    seed: int, safe: int, refresh: int, interval: int, minutes: int = 40
) -> tuple[list[tuple[int, int]], dict[str, int], dict[str, int]]:
    """An autoscaler that sees the tags at each refresh and asks for a random part (often all) of its
    room at random seconds; the governor's rounds (`decide` on what the status says) at their own
    offset (`Governor.plan`, as each round runs it). Returns (second, nodes asked) pairs, the final targets and the ceilings."""
    rng = random.Random(seed)
    ceilings = {f"g{i}": rng.randint(50, 900) for i in range(rng.randint(1, 6))}
    room = gov.budget(safe, refresh)
    governor = gov.Governor(lambda: None, Recorder(), ceilings, safe, 50, refresh_s=refresh)
    tags = gov.initial_maxes(ceilings, {}, room)
    target = dict.fromkeys(ceilings, 0)
    seen = dict(tags)
    asks: list[tuple[int, int]] = []
    r_off, g_off = rng.randrange(refresh), rng.randrange(interval)
    for t in range(minutes * 60):
        if t % refresh == r_off:
            seen = dict(tags)
        if t % interval == g_off:
            tags = governor.plan([group(n, target[n], seen[n]) for n in ceilings])
        if rng.random() < 0.3:
            for n in ceilings:
                free = seen[n] - target[n]
                if free > 0:
                    take = free if rng.random() < 0.6 else rng.randint(1, free)
                    target[n] += take
                    asks.append((t, take))
    return asks, target, ceilings


@pytest.mark.parametrize("seed", range(24))
def test_no_minute_sees_more_than_the_safe_rate_and_every_group_fills(seed: int) -> None:
    refresh, interval = random.Random(seed).choice([(60, 10), (60, 60), (30, 10), (10, 5)])
    asks, target, ceilings = simulate(seed, 300, refresh, interval)
    per_second = [0] * (max(t for t, _ in asks) + 61)
    for t, n in asks:
        per_second[t] += n
    busiest = max(sum(per_second[s : s + 60]) for s in range(len(per_second) - 59))
    assert 0 < busiest <= 300, (refresh, interval)
    assert target == ceilings  # the governor slows a scale-up; it never stops one short


def test_in_the_lab_a_round_reads_the_real_status_and_writes_the_kwok_templates(
    api: LocalApi, flagship_plan: Plan
) -> None:
    """Against the real API server: the governor's reader, as its own user, reads the status ConfigMap
    the autoscaler writes, and the lab's writer sets max-count on exactly the templates of the groups
    it changes."""
    sets = ca_lab.scale_sets(flagship_plan, pool="gpu")
    apply(api, *[o for o in ca_lab.provider_objects(sets) if o["kind"] == "ConfigMap"])
    apply(api, *autoscaler_rbac.governor_manifests(autoscaling.GOVERNOR_USER))
    apiserver.kubectl(
        api, "delete", "configmap", gov.STATUS_CONFIGMAP, "-n", gov.NAMESPACE, "--ignore-not-found"
    )
    reader = gov.KubeReader(api.client_kubeconfig("scale-governor", autoscaling.GOVERNOR_USER))
    assert reader.status() is None  # the autoscaler has not written it yet
    reading = READING.read_text()
    apply(api, {"apiVersion": "v1", "kind": "ConfigMap", "data": {"status": reading},
                "metadata": {"name": gov.STATUS_CONFIGMAP, "namespace": autoscaling.NAMESPACE}})  # fmt: skip
    ceilings = {s.name: s.capacity for s in sets}
    governor = gov.Governor(reader.status, ca_lab.KwokMaxSizes(api), ceilings, 300, 50)
    governor.last = dict(ceilings)
    round_ = governor.once()
    assert round_ is not None and round_.changed
    want = gov.Governor(lambda: None, Recorder(), ceilings, 300, 50).plan(gov.parse_status(reading))
    cm = json.loads(
        apiserver.kubectl(
            api, "get", "configmap", ca_lab.KWOK_TEMPLATES, "-n", autoscaling.NAMESPACE, "-o", "json"
        )
    )
    written = {
        t["metadata"]["annotations"][ca_lab.SCALE_SET_ANNOTATION]: int(
            t["metadata"]["annotations"][ca_lab.MAX_ANNOTATION]
        )
        for t in json.loads(cm["data"]["templates"])["items"]
    }
    assert written == {**ceilings, **want} and written != ceilings
