#!/usr/bin/env python3
"""Write data/cluster-autoscaler/<version>.flags: every flag one cluster-autoscaler release accepts.

Read from the release's own source, a git clone of kubernetes/autoscaler at the tag
cluster-autoscaler-<version>, and of kubernetes/component-base (leader-election flags):

    scripts/autoscaler_flags.py --version 1.35.2 --autoscaler DIR --component-base DIR

Sources: cluster-autoscaler/config/flags/flags.go (the autoscaler's own flags, `flag.<Type>("name"`
and `multiStringFlag("name"`), and component-base's config/options/leaderelectionconfig.go, which
main.go binds. klog's flags are left out on purpose: superkube does not set any.
"""

from __future__ import annotations

import argparse
import re
import subprocess
from pathlib import Path

OWN = re.compile(r'(?:flag\.\w+|multiStringFlag)\(\s*"([a-z0-9-]+)"')
LEADER = re.compile(r'fs\.\w+Var\(&\w+(?:\.\w+)*,\s*"([a-z0-9-]+)"')


def show(repo: Path, ref: str, path: str) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), "show", f"{ref}:{path}"], check=True, capture_output=True, text=True
    ).stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--version", required=True)
    parser.add_argument("--autoscaler", type=Path, required=True)
    parser.add_argument("--component-base", type=Path, required=True)
    parser.add_argument("--component-base-ref", default="HEAD")
    args = parser.parse_args()
    tag = f"cluster-autoscaler-{args.version}"
    own = set(OWN.findall(show(args.autoscaler, tag, "cluster-autoscaler/config/flags/flags.go")))
    main_go = show(args.autoscaler, tag, "cluster-autoscaler/main.go")
    if "BindLeaderElectionFlags" not in main_go:
        raise SystemExit(f"{tag}: main.go no longer binds the leader-election flags; update this script")
    leader = set(
        LEADER.findall(
            show(args.component_base, args.component_base_ref, "config/options/leaderelectionconfig.go")
        )
    )
    out = Path(__file__).resolve().parents[1] / "data" / "cluster-autoscaler" / f"{args.version}.flags"
    out.parent.mkdir(parents=True, exist_ok=True)
    lines = [
        f"# Flags of cluster-autoscaler {args.version}, read from its source at tag {tag}",
        "# (config/flags/flags.go, and component-base's leader-election flags that main.go binds).",
        "# Made by scripts/autoscaler_flags.py; do not edit by hand.",
        *sorted(own | leader),
    ]
    out.write_text("\n".join(lines) + "\n")
    print(f"wrote {out}: {len(own)} autoscaler flags, {len(leader)} leader-election flags")


if __name__ == "__main__":
    main()
