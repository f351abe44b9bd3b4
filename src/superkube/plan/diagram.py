"""The topology as an SVG picture: hub with NAT host, spoke with control plane and scale sets."""

from __future__ import annotations

from html import escape
from typing import Any

from superkube.cluster.kube import APISERVER_PORT
from superkube.model.words import plural

BOX = "fill:#f7f9fc;stroke:#34495e;stroke-width:1.5"
HUB = "fill:#eaf2fb;stroke:#2c6fbb;stroke-width:2"
SPOKE = "fill:#eef8ee;stroke:#2e8b57;stroke-width:2"
GPU = "fill:#fff4e0;stroke:#d9822b;stroke-width:1.2"
CPU = "fill:#f2f2f2;stroke:#7f8c8d;stroke-width:1.2"
CTRL = "fill:#f5eefb;stroke:#8e44ad;stroke-width:1.2"


def _rect(x: float, y: float, w: float, h: float, style: str, rx: int = 6) -> str:
    return f'<rect x="{x}" y="{y}" width="{w}" height="{h}" rx="{rx}" style="{style}"/>'


def _text(
    x: float, y: float, text: str, size: int = 12, weight: str = "normal", anchor: str = "start"
) -> str:
    return (
        f'<text x="{x}" y="{y}" font-family="Helvetica,Arial,sans-serif" font-size="{size}" '
        f'font-weight="{weight}" text-anchor="{anchor}">{escape(text)}</text>'
    )


def render(plan: dict[str, Any]) -> str:
    """SVG of a plan as `Plan.to_dict()` gives it (so a saved plan JSON draws the same picture)."""
    topo = plan["topology"]
    spoke = topo["spoke"]
    sets = [(pool, s) for pool in spoke["pools"] for s in pool["scale_sets"]]
    cols = 4
    rows = (len(sets) + cols - 1) // cols
    width = 980
    set_w, set_h, gap = 215, 62, 14
    spoke_top = 250
    sets_top = spoke_top + 150
    spoke_h = 160 + rows * (set_h + gap) + 20
    height = spoke_top + spoke_h + 20
    out: list[str] = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}">',
        f'<rect width="{width}" height="{height}" fill="white"/>',
        _text(20, 30, f"superkube cluster {plan['cluster']} (stack {plan['stack']})", 18, "bold"),
        _text(
            20,
            52,
            f"{plural(plan['capacity']['nodes'], 'node')}, {plural(plan['capacity']['gpus'], 'GPU')}, "
            f"{plural(plan['capacity']['scale_sets'], 'scale set')}, service CIDR {topo['service_cidr']}",
            13,
        ),
    ]
    # Hub
    out += [
        _rect(20, 75, 560, 130, HUB),
        _text(35, 98, f"hub VNet {topo['hub']['address_space']}", 14, "bold"),
    ]
    out += [
        _rect(40, 112, 240, 78, BOX),
        _text(52, 134, "NAT host", 13, "bold"),
        _text(52, 152, f"{topo['hub']['nat_host']} (IP forwarding)"),
        _text(52, 170, "no public IP"),
    ]
    routes = topo["hub"]["routes"] or [{"prefix": topo["service_cidr"], "next_hop": topo["hub"]["nat_host"]}]
    out += [_rect(300, 112, 260, 78, BOX), _text(312, 134, "shared subnet route table", 13, "bold")]
    for i, r in enumerate(routes[:2]):
        out.append(_text(312, 154 + 18 * i, f"{r['prefix']} -> {r['next_hop']}"))
    # Other spokes, peered to the hub only
    x = 600
    for name, space in list(topo.get("peered_spokes", {}).items())[:2]:
        out += [
            _rect(x, 95, 170, 60, "fill:#fafafa;stroke:#95a5a6;stroke-dasharray:4 3"),
            _text(x + 10, 118, f"spoke {name}", 12, "bold"),
            _text(x + 10, 138, space),
        ]
        out.append(f'<line x1="{x}" y1="125" x2="580" y2="140" stroke="#95a5a6" stroke-dasharray="4 3"/>')
        x += 190
    # Peering
    out.append('<line x1="300" y1="205" x2="300" y2="250" stroke="#2c6fbb" stroke-width="3"/>')
    out.append(_text(310, 232, "peering hub <-> spoke (spokes never peer each other)", 12))
    # Spoke
    out += [
        _rect(20, spoke_top, width - 40, spoke_h, SPOKE),
        _text(35, spoke_top + 24, f"spoke VNet {spoke['address_space']}", 14, "bold"),
    ]
    api = spoke["apiservers"]
    boxes = [
        (
            "API servers",
            [f"{plural(len(api['members']), 'VM')} behind ILB", f"{api['load_balancer']}:{APISERVER_PORT}"],
        ),
        ("etcd main", [plural(len(spoke["etcd_main"]), "member"), "premium data disks"]),
        ("etcd events", [plural(len(spoke["etcd_events"]), "member"), "/events override"]),
        (
            "monitoring",
            [
                plural(len(spoke["prometheus"]), "Prometheus shard"),
                f"-> {plural(len(spoke['metrics_store']), 'store host')}",
            ],
        ),
    ]
    for i, (title, lines) in enumerate(boxes):
        bx = 40 + i * 230
        out += [_rect(bx, spoke_top + 40, 215, 80, CTRL), _text(bx + 12, spoke_top + 62, title, 13, "bold")]
        out += [_text(bx + 12, spoke_top + 82 + 18 * j, line) for j, line in enumerate(lines)]
    out.append(
        _text(
            40,
            sets_top - 8,
            "node pools: one subnet per scale set, NICs carry 1 + pod IPs (alias IPs, no overlay)",
            12,
            "bold",
        )
    )
    for i, (pool, s) in enumerate(sets):
        bx = 40 + (i % cols) * (set_w + gap)
        by = sets_top + (i // cols) * (set_h + gap)
        out += [
            _rect(bx, by, set_w, set_h, GPU if pool["role"] == "gpu" else CPU),
            _text(bx + 10, by + 20, s["name"], 12, "bold"),
            _text(bx + 10, by + 38, f"{s['capacity']:,} x {pool['vm_size'].removeprefix('Standard_')}"),
            _text(bx + 10, by + 54, f"{s['subnet']}  zones {','.join(s['zones'])}"),
        ]
    out.append("</svg>")
    return "\n".join(out) + "\n"
