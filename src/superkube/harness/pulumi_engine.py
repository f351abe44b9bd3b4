"""Where the real Pulumi engine's binaries are, for the measurement that runs the in-cluster layer
through them (`scripts/build_pulumi.py` builds them, `bench/pulumi_up.py` runs them).

superkube's users run `pulumi up`; this machine cannot install a Pulumi release, so the CLI, the
Python language host and the Kubernetes provider are built from source (their Go modules where the
module proxy serves them, a checkout where it does not) into the lab's build cache:

    <cache>/pulumi/<CLI version>/
        bin/pulumi, bin/pulumi-language-python, bin/pulumi-language-python-exec,
        bin/pulumi-resource-kubernetes
        manifest.json   what was built, from where, at which version, and how far each is from the pins

Nothing here builds or runs anything: it names the versions and reads the manifest.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from superkube.harness.build import CACHE_DIR

CLI_MODULE = "github.com/pulumi/pulumi/pkg/v3"
SDK_MODULE = "github.com/pulumi/pulumi/sdk/v3"
PROVIDER_MODULE = "github.com/pulumi/pulumi-kubernetes/provider/v4"
PROVIDER_SDK_MODULE = "github.com/pulumi/pulumi-kubernetes/sdk/v4"

CLI_VERSION = "v3.274.0"
"""The served release of the CLI's module nearest the Python SDK's pin (the proxy serves no v3.272)."""
HOST_REF = "v3.259.0"
"""The newest release tag the checkout of pulumi/pulumi has: the language host's own package is taken
from it (the proxy does not serve it as a module)."""
PROVIDER_VERSION = "v4.0.0-20260115033456-f47bc2d6f199"
"""The one version of the provider's module the proxy serves (a January 2026 commit)."""

BINARIES = (
    "pulumi",
    "pulumi-language-python",
    "pulumi-language-python-exec",
    "pulumi-resource-kubernetes",
)


def pins(constraints: Path) -> dict[str, str]:
    """The Python SDKs' pins in constraints.txt: pulumi, pulumi_kubernetes, pulumi_policy."""
    found: dict[str, str] = {}
    for line in constraints.read_text().splitlines():
        name, _, version = line.strip().partition("==")
        if name in ("pulumi", "pulumi_kubernetes", "pulumi_policy") and version:
            found[name] = version.strip()
    return found


def distance(got: str, pinned: str) -> str:
    """How far a built version is from a pin, in releases: "same", "2 minor newer", "pseudo-version of
    a commit, 10 minor older than the pin"... Versions are semver, with or without a leading v."""
    g = re.match(r"v?(\d+)\.(\d+)\.(\d+)(-.+)?$", got)
    p = re.match(r"v?(\d+)\.(\d+)\.(\d+)", pinned)
    if not g or not p:
        return f"{got} vs {pinned}: not comparable"
    gv, pv = tuple(int(x) for x in g.groups()[:3]), tuple(int(x) for x in p.groups())
    if g.group(4):
        return f"a pseudo-version (an untagged commit), recorded as {got}; the pin is {pinned}"
    if gv == pv:
        return "same"
    for i, what in enumerate(("major", "minor", "patch")):
        if gv[i] != pv[i]:
            step = gv[i] - pv[i]
            return f"{abs(step)} {what} {'newer' if step > 0 else 'older'} than the pin {pinned}"
    return "same"


def entry(cache_dir: Path = CACHE_DIR, cli_version: str = CLI_VERSION) -> Path:
    return cache_dir / "pulumi" / cli_version


def manifest(cache_dir: Path = CACHE_DIR, cli_version: str = CLI_VERSION) -> dict[str, Any] | None:
    """The build's manifest, or None when it has not been built (or not every binary is there)."""
    path = entry(cache_dir, cli_version)
    try:
        data: dict[str, Any] = json.loads((path / "manifest.json").read_text())
    except (OSError, ValueError):
        return None
    if not all((path / "bin" / name).is_file() for name in BINARIES):
        return None
    return data
