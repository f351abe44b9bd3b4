#!/usr/bin/env python3
"""Build cluster-autoscaler with its kwok cloud provider for the lab (`superkube.harness.autoscaler`).

cluster-autoscaler is not published as a Go module the lab's build can fetch, so this builds it from
a git clone of kubernetes/autoscaler, at the tag of the release superkube pins:

    scripts/build_autoscaler.py --autoscaler DIR [--version 1.35.2]

It exports the tag's `cluster-autoscaler/` tree into a scratch folder (the clone is left as it
was), checks the release's own version constant, makes the one lab change below, and runs
`go build -tags kwok` (only the kwok provider compiled in) into the lab's build cache, where
`superkube.harness.autoscaler.binary()` finds it. Go fetches the modules the release's go.mod names.

Two lab changes, both in the kwok provider, each making it behave as Azure's provider does:

1. The kwok provider creates each Node of a scale-up with its own API client, which
client-go limits to 5 requests a second, so 1,000 nodes would take 200 s to appear whatever the
autoscaler decided. On Azure a scale-up is one call that sets a scale set's capacity. The build
lifts that client's limit (a negative QPS turns client-go's limiter off), so the lab's nodes appear
when the autoscaler asks for them.
2. The kwok provider reads a node group's max-count from its template once, at start. Azure's
   provider re-reads a scale set's `max` tag at every refresh of its cache (one minute), which is
   what the scale-up governor (`superkube.agents.scale_governor`) acts through. The build adds
   `REFRESH_GO`: at each `Refresh` it re-reads the templates' max-count once `SUPERKUBE_LAB_REFRESH_S`
   seconds (default 60, Azure's) have passed since it last did.
Nothing else in the release changes.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "src")]

from superkube.agents import scale_governor  # noqa: E402
from superkube.cluster import autoscaling  # noqa: E402
from superkube.harness import autoscaler, build  # noqa: E402

PROVIDER = "cloudprovider/kwok/kwok_provider.go"
ANCHOR = "\tkubeClient := kubeclient.NewForConfigOrDie(restConfig)\n"
LAB_CHANGE = "\trestConfig.QPS = -1 // superkube lab: a scale-up's nodes appear at once, as on Azure\n"
REFRESH_ANCHOR = "\t\tng.targetSize = targetSizeInCluster[ng.Id()]\n\t}\n"
REFRESH_CALL = "\tkwok.superkubeRefreshMax() // superkube lab: re-read max sizes, as Azure's provider does\n"
REFRESH_GO = """package kwok

// superkube lab: re-read each node group's max-count from the templates ConfigMap at most every
// SUPERKUBE_LAB_REFRESH_S seconds (by default the governor's PROVIDER_REFRESH_S), as Azure's provider re-reads a scale set's
// max tag at each refresh of its cache.

import (
\t"os"
\t"strconv"
\t"time"

\t"k8s.io/klog/v2"
)

var superkubeLastRead time.Time

func (kwok *KwokCloudProvider) superkubeRefreshMax() {
\tevery := @REFRESH_SECONDS@ * time.Second
\tif s, err := strconv.Atoi(os.Getenv("SUPERKUBE_LAB_REFRESH_S")); err == nil && s >= 0 {
\t\tevery = time.Duration(s) * time.Second
\t}
\tif kwok.config.ReadNodesFrom != nodeTemplatesFromConfigMap || time.Since(superkubeLastRead) < every {
\t\treturn
\t}
\ttemplates, err := LoadNodeTemplatesFromConfigMap(kwok.config.ConfigMap.Name, kwok.kubeClient)
\tif err != nil {
\t\tklog.Errorf("superkube lab: cannot re-read node group max sizes: %v", err)
\t\treturn
\t}
\tsuperkubeLastRead = time.Now()
\tfor _, no := range templates {
\t\tname := getNGName(no, kwok.config)
\t\tvalue := no.GetAnnotations()[NGMaxSizeAnnotation]
\t\tmax, err := strconv.Atoi(value)
\t\tfor _, ng := range kwok.nodeGroups {
\t\t\tif ng.Id() != name || (err == nil && ng.maxSize == max) {
\t\t\t\tcontinue
\t\t\t}
\t\t\t// not upstream's parseAnnotations: it exits the process on a bad value, where Azure's
\t\t\t// provider keeps the group as it was; so does this
\t\t\tif err != nil || max < ng.minSize {
\t\t\t\tklog.Errorf("superkube lab: node group %s: max-count %q is not a number >= min %d; keeping %d", name, value, ng.minSize, ng.maxSize)
\t\t\t\tcontinue
\t\t\t}
\t\t\tklog.Infof("superkube lab: node group %s max size %d -> %d", name, ng.maxSize, max)
\t\t\tng.maxSize = max
\t\t}
\t}
}
"""
REFRESH_GO = REFRESH_GO.replace("@REFRESH_SECONDS@", str(scale_governor.PROVIDER_REFRESH_S))


def fail(message: str) -> None:
    print(f"build_autoscaler: {message}", file=sys.stderr)
    sys.exit(1)


def main() -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--autoscaler", type=Path, required=True, help="a git clone of kubernetes/autoscaler")
    p.add_argument("--version", default=autoscaling.VERSION)
    args = p.parse_args()
    tag = f"cluster-autoscaler-{args.version}"
    out = autoscaler.binary_path(args.version)
    with tempfile.TemporaryDirectory(prefix="ca-build-") as scratch:
        archive = subprocess.run(
            ["git", f"--git-dir={args.autoscaler / '.git'}" if (args.autoscaler / ".git").exists()
             else f"--git-dir={args.autoscaler}", "archive", tag, "cluster-autoscaler"],
            capture_output=True,
        )  # fmt: skip
        if archive.returncode != 0:
            fail(f"{args.autoscaler} has no tag {tag} ({archive.stderr.decode().strip()}): fetch the tags")
        subprocess.run(["tar", "-x", "-C", scratch], input=archive.stdout, check=True)
        src = Path(scratch) / "cluster-autoscaler"
        version = re.search(r'ClusterAutoscalerVersion = "([^"]+)"', (src / "version/version.go").read_text())
        if not version or version.group(1) != args.version:
            fail(f"{tag} says it is version {version and version.group(1)}, not {args.version}")
        provider = src / PROVIDER
        text = provider.read_text()
        if text.count(ANCHOR) != 1:
            fail(f"{PROVIDER} at {tag} no longer builds its client where this script expects: update ANCHOR")
        if text.count(REFRESH_ANCHOR) != 1:
            fail(
                f"{PROVIDER} at {tag} no longer sets target sizes in Refresh as expected: update REFRESH_ANCHOR"
            )
        text = text.replace(ANCHOR, LAB_CHANGE + ANCHOR)
        provider.write_text(text.replace(REFRESH_ANCHOR, REFRESH_ANCHOR + REFRESH_CALL))
        (provider.parent / "kwok_superkube_lab.go").write_text(REFRESH_GO)
        out.parent.mkdir(parents=True, exist_ok=True)
        partial = out.with_suffix(".partial")
        print(f"building cluster-autoscaler {args.version} (kwok provider) into {out}", file=sys.stderr)
        go = build.go_binary(lambda what: print(what, file=sys.stderr))  # the components' pinned Go
        built = subprocess.run(
            [go, "build", "-tags", "kwok", "-o", str(partial), "."],
            cwd=src, env={**build.go_env(go), "CGO_ENABLED": "0"},
        )  # fmt: skip
        if built.returncode != 0:
            fail(f"go build failed (exit {built.returncode}); its output is above")
        shutil.move(partial, out)
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
