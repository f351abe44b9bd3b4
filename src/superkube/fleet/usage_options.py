"""What `superkube usage` may be asked for: the traffic kinds, and how to group and sort them.

Apart from superkube.fleet.usage, which asks the metrics store over HTTP, so that the command line
can offer these as options without loading what only `superkube usage` runs.
"""

from __future__ import annotations

from enum import StrEnum

TRAFFIC = ("internet-out", "internet-in", "internal-out", "internal-in")
"""The exporter's `traffic` values, in the order the command shows them."""


class By(StrEnum):
    namespace = "namespace"
    pod = "pod"


class Sort(StrEnum):
    total = "total"
    internet = "internet"
    internal = "internal"
    internet_out = "internet-out"
    internet_in = "internet-in"
    internal_out = "internal-out"
    internal_in = "internal-in"
