"""Bandwidth as Kubernetes writes it: the `kubernetes.io/egress-bandwidth` annotation's quantities.

The spec's `egress_limit` is read with this grammar, so a stack accepts exactly what the kubelet
accepts on a pod. Standard library only: the lab's CNI runtime (`superkube.lab.cnirun`) runs on lab
hosts with this file beside it.
"""

from __future__ import annotations

import re
from decimal import ROUND_CEILING, Decimal, InvalidOperation

# the kubelet's own bounds for the bandwidth annotations (1 kbit/s to 1 Pbit/s)
MIN_RATE = 1_000
MAX_RATE = 10**15

_SUFFIX = {
    "": 1,
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "P": 10**15,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "Pi": 2**50,
}
_QUANTITY = re.compile(r"^([0-9]+(?:\.[0-9]+)?)([A-Za-z]*)$")


class RateError(ValueError):
    """A rate that is not a Kubernetes quantity of bits per second in the kubelet's range."""


def parse_rate(text: str | int) -> int:
    """A bandwidth quantity as the kubelet reads the annotation ("10M", "1G", "500Ki") -> bits/s."""
    raw = str(text).strip()
    match = _QUANTITY.match(raw)
    if not match or match.group(2) not in _SUFFIX:
        unit = match.group(2) if match else ""
        hint = " ('m' means milli; write M for mega)" if unit == "m" else ""
        raise RateError(
            f"{raw!r} is not a rate{hint}; write bits per second as a Kubernetes quantity "
            "such as 10M, 500M, 1G or 2Gi"
        )
    try:
        value = Decimal(match.group(1)) * _SUFFIX[match.group(2)]
    except InvalidOperation:
        raise RateError(f"{raw!r} is not a number of bits per second") from None
    bits = int(value.to_integral_value(rounding=ROUND_CEILING))
    if not MIN_RATE <= bits <= MAX_RATE:
        raise RateError(f"{raw!r} is outside 1k to 1P bits per second (the kubelet's bounds)")
    return bits
