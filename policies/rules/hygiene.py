"""Hygiene: who owns what."""

from __future__ import annotations

from collections.abc import Iterator

from superkube.model.policy import TAGLESS_TYPES, Finding, Rule, RuleConfig, StackView

REQUIRED = ("cluster", "owner", "environment")


def _required_tags(view: StackView, config: RuleConfig) -> Iterator[Finding]:
    for r in view.resources:
        if not r.type.startswith("azure-native:") or r.type in TAGLESS_TYPES:
            continue
        tags = {str(k).lower(): v for k, v in r.tags.items()}  # Azure tag names ignore case
        missing = [t for t in REQUIRED if not tags.get(t)]
        if missing:
            yield Finding(f"missing tags: {', '.join(missing)}", r.urn)
        elif config.cluster and tags["cluster"] != config.cluster:
            yield Finding(f"cluster tag is {tags['cluster']!r}, not {config.cluster!r}", r.urn)


RULES = [
    Rule(
        "hygiene-resource-required-tags",
        "medium",
        "Every taggable resource carries cluster, owner and environment tags.",
        "Set superkube:team and superkube:environment; components tag everything they create.",
        _required_tags,
    ),
]
