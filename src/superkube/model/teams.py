"""Team capacity: which team each node belongs to, from one configuration of tuples.

A tuple is (node selector -> team, priority). A node matched by one or more tuples belongs to the
team of the highest-priority match and carries the taint `superkube.io/team=<team>:NoSchedule`; a
node no tuple matches carries no team taint and is anyone's. The team `any` marks capacity anyone
may borrow: its nodes carry `superkube.io/team=any:NoSchedule`, which a pod tolerates only when it
opts in with the label `superkube.io/borrow: "true"`.

The same data is the stack key `teams` (planned and reviewed) and the ConfigMap the reconciler
(agents/team_taints.py) and the admission webhook (agents/team_webhook.py) read in the cluster.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

TEAM_KEY = "superkube.io/team"
"""The node taint's key and the pod label that names a pod's team."""
BORROW_LABEL = "superkube.io/borrow"
"""A pod label: "true" opts the pod into capacity marked `any`."""
ANY = "any"
TAINT_EFFECT = "NoSchedule"
CONFIG_FILE = "teams.yaml"
"""The key of the teams ConfigMap, and the file name it is mounted as."""

_TEAM = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
_LABEL_NAME = re.compile(
    r"^([a-z0-9]([a-z0-9.-]{0,251}[a-z0-9])?/)?[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?$"
)
_LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?)?$")


class TeamTuple(BaseModel):
    """One tuple: nodes whose labels include every pair of `selector` belong to `team`."""

    model_config = ConfigDict(extra="forbid", frozen=True, str_strip_whitespace=True)

    selector: dict[str, str] = Field(
        min_length=1, description="Node labels a node must all carry, e.g. {superkube.io/pool: gpu}."
    )
    team: str = Field(description="The team (a DNS label), or `any` for capacity anyone may borrow.")
    priority: int = Field(
        default=0, ge=0, le=1000, description="Among tuples matching one node, the highest wins."
    )

    @field_validator("team")
    @classmethod
    def _team(cls, v: str) -> str:
        if not _TEAM.match(v):
            raise ValueError(f"{v!r} is not a team name; use a DNS label (a-z, 0-9, '-'), e.g. research")
        return v

    @field_validator("selector")
    @classmethod
    def _selector(cls, v: dict[str, str]) -> dict[str, str]:
        for key, value in v.items():
            if not _LABEL_NAME.match(key):
                raise ValueError(f"{key!r} is not a label key; write [prefix/]name, e.g. superkube.io/pool")
            if not _LABEL_VALUE.match(str(value)):
                raise ValueError(
                    f"{key}: {value!r} is not a label value (63 characters a-z, A-Z, 0-9, '-_.')"
                )
        return {k: str(val) for k, val in v.items()}

    def matches(self, labels: Mapping[str, str]) -> bool:
        return all(labels.get(k) == v for k, v in self.selector.items())

    def undecided_by(self, labels: Mapping[str, str]) -> list[str]:
        """The selector's keys that labels known before a node exists (its pool's template) leave
        open: none when the template matches every pair, or rules the tuple out by one of them."""
        if any(k in labels and labels[k] != v for k, v in self.selector.items()):
            return []
        return sorted(k for k in self.selector if k not in labels)


class TeamsError(ValueError):
    """A teams configuration that cannot be applied: one line naming the tuple and the fix."""


def overlap(a: TeamTuple, b: TeamTuple) -> bool:
    """True when some node could carry both selectors' labels (no key wants two values)."""
    return all(b.selector.get(k, v) == v for k, v in a.selector.items())


OVERLAP_FIX = (
    "make the selectors disjoint (a label value only one team's nodes carry), or mark the shared nodes any"
)
"""How to fix two teams' tuples that can select the same nodes: said by the spec when a stack is
planned and by the policy rule platform-teams-no-overlap when it is checked, so the two agree."""
ANY_PRIORITY_FIX = "give the tuple whose nodes they should be a higher priority"
"""How to fix a team's tuple and one of `any` that can select the same nodes at one priority."""


def conflicts(tuples: Sequence[TeamTuple]) -> list[tuple[int, int]]:
    """Pairs of tuples of two different teams, neither `any`, that can match the same node."""
    return [
        (i, j)
        for i, a in enumerate(tuples)
        for j, b in enumerate(tuples)
        if i < j and a.team != b.team and ANY not in (a.team, b.team) and overlap(a, b)
    ]


def problems(tuples: Sequence[TeamTuple], where: str = "teams") -> list[str]:
    """Why these tuples cannot say whose a node is, one line each, with the fix (empty when they can).

    Two teams' tuples that can match one node are refused at any priority: priority would decide
    silently which team loses the node (OVERLAP_FIX). A team's tuple and one of `any` may overlap
    (a team's part of borrowable capacity), but not at one priority, which decides nothing."""
    found = []
    for i, j in conflicts(tuples):
        a, b = tuples[i], tuples[j]
        same = f" at the same priority {a.priority}" if a.priority == b.priority else ""
        found.append(
            f"{where}[{j}]: selector {b.selector} ({b.team}) can match the nodes of {where}[{i}] ({a.team}){same}, "
            f"and two teams may not share nodes; {OVERLAP_FIX}"
        )
    for i, a in enumerate(tuples):
        for j, b in enumerate(tuples):
            if (
                i < j
                and ANY in (a.team, b.team)
                and a.team != b.team
                and a.priority == b.priority
                and overlap(a, b)
            ):
                found.append(
                    f"{where}[{j}]: selector {b.selector} ({b.team}) can match the nodes of {where}[{i}] "
                    f"({a.team}) at the same priority {a.priority}; {ANY_PRIORITY_FIX}"
                )
    return found


def check(tuples: Sequence[TeamTuple], where: str = "teams") -> None:
    """Tuples that cannot say whose a node is (see `problems`): a TeamsError, the first of them."""
    found = problems(tuples, where)
    if found:
        raise TeamsError(found[0])


def parse(data: Any, where: str = "teams", *, checked: bool = True) -> list[TeamTuple]:
    """The tuples of a YAML-loaded list; a bad one is a TeamsError naming its index. Unless
    `checked` is false, tuples that cannot say whose a node is are one too (`check`)."""
    if data is None:
        return []
    if not isinstance(data, list):
        raise TeamsError(
            f"{where}: must be a YAML list of {{selector, team, priority}}, got {type(data).__name__}"
        )
    tuples = []
    for i, item in enumerate(data):
        try:
            tuples.append(TeamTuple.model_validate(item))
        except ValidationError as e:
            first = e.errors(include_url=False)[0]
            loc = "".join(f".{p}" for p in first["loc"])
            msg = str(first["msg"]).removeprefix("Value error, ")
            raise TeamsError(f"{where}[{i}]{loc}: {msg}") from None
    if checked:
        check(tuples, where)
    return tuples


def load_file(path: Path) -> list[TeamTuple]:
    """The tuples in a teams file (the mounted ConfigMap); a TeamsError (one line) when unusable."""
    from superkube.model import files

    fix = "write a YAML list of {selector, team, priority}"
    try:
        data = files.parse_yaml(files.read_text(path), str(path), fix)
    except files.FileError as e:
        raise TeamsError(str(e)) from None
    return parse(data, str(path))


def owner(tuples: Iterable[TeamTuple], labels: Mapping[str, str]) -> str | None:
    """The team a node with these labels belongs to (None: anyone's, no team taint)."""
    best: TeamTuple | None = None
    for t in tuples:
        if t.matches(labels) and (best is None or t.priority > best.priority):
            best = t
    return best.team if best else None


def template_owner(tuples: Iterable[TeamTuple], labels: Mapping[str, str]) -> str | None:
    """The team of nodes that will carry these labels from registration (a pool's node template):
    the owner by the tuples those labels decide; one on a label nodes get later is left out."""
    return owner([t for t in tuples if not t.undecided_by(labels)], labels)


def taint(team: str) -> dict[str, str]:
    return {"key": TEAM_KEY, "value": team, "effect": TAINT_EFFECT}


def toleration(team: str) -> dict[str, str]:
    return {"key": TEAM_KEY, "operator": "Equal", "value": team, "effect": TAINT_EFFECT}


def tolerations_for(team: str, borrow: bool) -> list[dict[str, str]]:
    """The team tolerations a pod of `team` gets: its own, and `any` when it borrows."""
    out = [toleration(team)]
    if borrow and team != ANY:
        out.append(toleration(ANY))
    return out


def reaches_team_nodes(tol: Mapping[str, Any]) -> bool:
    """A toleration that would let a pod past some team's taint: any of the team key, or a key-less
    `Exists` that tolerates every taint of the NoSchedule effect."""
    effect = tol.get("effect") or ""
    if effect not in ("", TAINT_EFFECT):
        return False
    key = tol.get("key") or ""
    return key == TEAM_KEY or (key == "" and tol.get("operator") == "Exists")


def to_document(tuples: Sequence[TeamTuple]) -> list[dict[str, Any]]:
    return [t.model_dump() for t in tuples]


WEBHOOK_TLS_KEY = "superkube-secrets:team_webhook_tls"
"""The secret config key holding the team webhook's PEM bundle (its certificate, key and the cluster
CA), which `superkube converge` writes as <inventory dir>/pki/team-webhook.pem. In a namespace of its
own, like the kubeconfig, so it is never a declared (and so required) `superkube:` key."""
PLAN_WEBHOOK_TLS = "plan: no certificate is read"
"""Stands in for that secret under the mock engine."""
WEBHOOK_TLS_SECRET = "superkube-team-webhook-tls"
"""The kubernetes.io/tls Secret that holds the webhook's key pair in the cluster, made from that secret."""


def set_webhook_tls(stack: str = "<cluster>") -> str:
    """The command that gives a stack the webhook's bundle, from the file converge writes."""
    return f"pulumi config set --secret {WEBHOOK_TLS_KEY} -s {stack} < <inventory dir>/pki/team-webhook.pem"


_PEM = re.compile(r"-----BEGIN ([A-Z ]+)-----\s.*?-----END \1-----", re.S)


def split_bundle(pem: str) -> tuple[str, str, str]:
    """(certificate, key, CA certificate) of a bundle: the first certificate, the private key, the
    last certificate. A bundle without all three is a TeamsError saying how to make one."""
    if pem == PLAN_WEBHOOK_TLS:
        return pem, pem, pem
    blocks = [(m.group(1), m.group(0) + "\n") for m in _PEM.finditer(pem)]
    certs = [b for kind, b in blocks if kind == "CERTIFICATE"]
    keys = [b for kind, b in blocks if kind.endswith("PRIVATE KEY")]
    if len(certs) < 2 or len(keys) != 1:
        raise TeamsError(
            f"{WEBHOOK_TLS_KEY}: wants the webhook's certificate, its private key and the CA certificate "
            f"(found {len(certs)} certificates, {len(keys)} keys); set it from the file converge writes: "
            f"pulumi config set --secret {WEBHOOK_TLS_KEY} < <inventory dir>/pki/team-webhook.pem"
        )
    return certs[0], keys[0], certs[-1]
