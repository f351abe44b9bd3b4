"""Jinja filters: check component flags against a versioned list of the component's own flags,
and build the kubeconfigs every component and the admin use.

`flags | superkube_flag_problems(known)` returns one line per problem (unknown flag, wrong value
type or form); an empty list means every flag exists in that version and has a value of its type.
"""

from __future__ import annotations

import base64
import difflib
import ipaddress
import re
from pathlib import Path
from typing import Any

DURATION = re.compile(r"^(0|([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+)$")
CHECKS = {
    "bool": lambda v: isinstance(v, bool) or str(v).lower() in ("true", "false"),
    "int": lambda v: not isinstance(v, bool) and re.fullmatch(r"-?[0-9]+", str(v)) is not None,
    "float": lambda v: not isinstance(v, bool) and re.fullmatch(r"-?[0-9]*\.?[0-9]+", str(v)) is not None,
    "duration": lambda v: DURATION.match(str(v)) is not None,
}


def flag_problems(flags: dict[str, Any], known: dict[str, str]) -> list[str]:
    problems = []
    for name, value in sorted(flags.items()):
        if name.startswith("-"):
            problems.append(f"{name}: write flag names without the leading dashes")
        elif name not in known:
            close = difflib.get_close_matches(name, list(known), n=3, cutoff=0.75)
            hint = f"; did you mean {' or '.join('--' + c for c in close)}?" if close else ""
            problems.append(f"--{name}: not a flag of this version{hint}")
        elif known[name] in CHECKS and not CHECKS[known[name]](value):
            problems.append(f"--{name}={value}: expects a {known[name]}")
        elif value is None or str(value) == "":
            problems.append(f"--{name}: has no value; remove it or give one")
    return problems


def flag_args(flags: dict[str, Any]) -> list[str]:
    """--name=value for each flag, sorted; booleans as true/false."""
    out = []
    for name, value in sorted(flags.items()):
        text = str(value).lower() if isinstance(value, bool) else str(value)
        out.append(f"--{name}={text}")
    return out


def kubeconfig(
    server: str,
    ca_file: str,
    user: str,
    cert: str | None = None,
    key: str | None = None,
    token: str | None = None,
    cluster: str = "superkube",
    embed: bool = False,
) -> dict[str, Any]:
    """A kubeconfig (v1) for one user of one cluster: a client certificate, or a bearer token.

    With `embed`, the CA, certificate and key are read now (on the controller) and carried inline
    as *-data fields, so the kubeconfig works anywhere, e.g. as a Pulumi secret.
    """
    credentials: dict[str, str] = {}
    if cert and key:
        credentials = (
            {"client-certificate-data": _b64(cert), "client-key-data": _b64(key)}
            if embed
            else {"client-certificate": cert, "client-key": key}
        )
    if token:
        credentials["token"] = token
    if not credentials:
        raise ValueError(f"kubeconfig for {user}: give a client certificate and key, or a token")
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": cluster,
                "cluster": {"server": server, "certificate-authority-data": _b64(ca_file)}
                if embed
                else {"server": server, "certificate-authority": ca_file},
            }
        ],
        "users": [{"name": user, "user": credentials}],
        "contexts": [{"name": f"{user}@{cluster}", "context": {"cluster": cluster, "user": user}}],
        "current-context": f"{user}@{cluster}",
        "preferences": {},
    }


def _b64(path: str) -> str:
    return base64.b64encode(Path(path).read_bytes()).decode()


def nth_host(cidr: str, n: int) -> str:
    """The n-th address of a network (1 = the first after the network address)."""
    return str(ipaddress.ip_network(cidr, strict=False).network_address + int(n))


def args_to_flags(args: list[str]) -> dict[str, str]:
    """A command line of --name=value arguments as the {name: value} kube_component takes."""
    flags = {}
    for arg in args:
        name, eq, value = str(arg).removeprefix("--").partition("=")
        if not str(arg).startswith("--") or not eq:
            raise ValueError(f"{arg!r}: write each flag as --name=value")
        flags[name] = value
    return flags


def autoscaler_flag_reference(version: str) -> dict[str, str]:
    """Every flag of cluster-autoscaler `version`, from data/cluster-autoscaler/<version>.flags
    (value types are not recorded there: any value is taken)."""
    path = Path(__file__).resolve().parents[2] / "data" / "cluster-autoscaler" / f"{version}.flags"
    if not path.is_file():
        raise ValueError(
            f"no flag list for cluster-autoscaler {version}: add {path.name} under data/cluster-autoscaler"
        )
    lines = (line.strip() for line in path.read_text().splitlines())
    return {line: "other" for line in lines if line and not line.startswith("#")}


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {
            "superkube_args_to_flags": args_to_flags,
            "superkube_autoscaler_flag_reference": autoscaler_flag_reference,
            "superkube_flag_problems": flag_problems,
            "superkube_flag_args": flag_args,
            "superkube_nth_host": nth_host,
            "superkube_kubeconfig": kubeconfig,
        }
