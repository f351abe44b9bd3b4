"""`superkube check` and `policy-config`: the policy rules on a plan, for review and for CrossGuard."""

from __future__ import annotations

import json
import os
import sys
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from superkube.cli.common import (
    ProjectOpt,
    StackOpt,
    err,
    fail,
    out,
    package_version,
    project_dir,
    read_file,
)
from superkube.model.spec import SpecError


class CheckOutput(StrEnum):
    table = "table"
    json = "json"
    sarif = "sarif"
    markdown = "markdown"


def _load_plan_document(path: Path) -> dict[str, Any]:
    """A plan saved by `superkube plan --out`, with the parts `check` reads; one line and exit 2 for
    a file that is not one."""
    if path.suffix in (".yaml", ".yml"):  # most likely a stack file: never suggest writing over it
        fix = f"--plan takes a saved plan (JSON); check a stack with superkube check --stack {path}"
    else:
        fix = f"write one with: superkube plan --stack <name> --out {path}"
    document: dict[str, Any] = read_file(
        path, "--plan", fix, kind="json", what="a superkube plan (a JSON object)"
    )
    at = f"--plan {path}"
    if document.get("format") != "superkube-plan/1":
        fail(f"{at}: not a superkube plan (format superkube-plan/1); {fix}")
    for key, want, what in (
        ("stack", str, "the stack's name"),
        ("config", dict, "the stack's config"),
        ("resources", list, "every resource"),
    ):
        if key not in document:
            fail(f"{at}: has no {key!r} ({what}), so it is not a whole plan; {fix}")
        if not isinstance(document[key], want):
            fail(
                f"{at}: {key!r} must be a {'list' if want is list else 'mapping' if want is dict else 'string'}; {fix}"
            )
    for i, r in enumerate(document["resources"]):
        if not isinstance(r, dict):
            fail(f"{at}: resources[{i}] must be a mapping; {fix}")
        for key in ("urn", "type", "name"):
            if not isinstance(r.get(key), str):
                fail(f"{at}: resources[{i}] has no {key!r} string; {fix}")
        for key, want in (("inputs", dict), ("dependencies", list), ("parent", str)):
            if r.get(key) is not None and not isinstance(r[key], want):
                fail(
                    f"{at}: resources[{i}].{key} must be a {'mapping' if want is dict else want.__name__}; {fix}"
                )
    for key, value in document["config"].items():
        if not isinstance(value, str):
            fail(f"{at}: config {key!r} must be a string, as Pulumi hands it to the program; {fix}")
    return document


def _stack_report_inputs(stack: str, plan_file: Path | None, project: Path | None) -> tuple[Any, ...]:
    """(view, spec, addresses, stack name, source path) for a stack or a saved plan."""
    from superkube.model import policy
    from superkube.plan import checks
    from superkube.plan import engine as planning

    root = project_dir(project)
    if plan_file is not None:
        document = _load_plan_document(plan_file)
        name = document["stack"]
        spec, addresses = planning.spec_from_config(document["config"], name)
        source = _relative(planning.stack_path(root, name), root)
        return checks.view_from_plan_document(document), spec, addresses, name, source, root
    with err.status(f"planning stack {stack} under the mock engine", spinner="dots"):
        result = planning.run(root, stack)
    view = policy.StackView(
        policy.PlanResource(r.urn, r.type, r.name, r.inputs, r.parent, tuple(r.dependencies))
        for r in result.resources
    )
    return (
        view,
        result.spec,
        result.addresses,
        result.stack,
        _relative(planning.stack_path(root, stack), root),
        root,
    )


def _relative(path: Path, root: Path) -> str:
    """A path as code scanning wants it: relative to the project, with forward slashes."""
    return Path(os.path.relpath(path.resolve(), root)).as_posix()


def _rule_dict(rule: Any) -> dict[str, str]:
    return {
        "name": rule.name,
        "severity": rule.severity,
        "enforcement": rule.enforcement,
        "description": rule.description,
        "remediation": rule.remediation,
    }


def check(
    stack: Annotated[
        str | None,
        typer.Option("--stack", "-s", help="Stack name or stack file path (default: dev); not with --plan."),
    ] = None,
    plan_file: Annotated[
        Path | None,
        typer.Option("--plan", help="Check a plan saved by `superkube plan --out` instead of planning."),
    ] = None,
    output: Annotated[
        CheckOutput,
        typer.Option("--output", "-o", help="table, json, sarif (code scanning) or markdown (PR comment)."),
    ] = CheckOutput.table,
    list_rules: Annotated[bool, typer.Option("--list", help="List every rule and exit.")] = False,
    project: ProjectOpt = None,
) -> None:
    """Evaluate every policy rule on the offline plan; exit 1 on any mandatory violation."""
    from superkube.plan import checks
    from superkube.plan import engine as planning

    if plan_file is not None and stack is not None:
        fail(f"--plan {plan_file} and --stack {stack}: a saved plan names its own stack; give one of them")
    stack = stack or "dev"
    try:
        rules = checks.load_rules(project_dir(project))
        if list_rules:
            if output is CheckOutput.json:
                sys.stdout.write(json.dumps([_rule_dict(r) for r in rules], indent=2) + "\n")
            elif output is not CheckOutput.table:
                fail(f"--list prints a table or json, not {output.value}")
            else:
                _print_rules(rules)
            return
        view, spec, addresses, name, source, _ = _stack_report_inputs(stack, plan_file, project)
        checks.check_overrides(spec.policy_overrides, rules)
        report = checks.evaluate(
            view, rules, checks.rule_config(spec, addresses), spec.policy_overrides, stack=name, source=source
        )
    except SpecError as exc:
        fail(str(exc))
    except planning.PlanError as exc:
        fail(str(exc), code=1)
    if output is CheckOutput.json:
        sys.stdout.write(checks.to_json(report) + "\n")
    elif output is CheckOutput.sarif:
        sys.stdout.write(checks.to_sarif(report, package_version()) + "\n")
    elif output is CheckOutput.markdown:
        sys.stdout.write(checks.to_markdown(report))
    else:
        _print_report(report)
    if not report.passed:
        raise typer.Exit(1)


def _print_rules(rules: list[Any]) -> None:
    table = Table(title="Policy rules", title_justify="left")
    for col in ("rule", "severity", "default", "what it checks"):
        table.add_column(col)
    for r in rules:
        table.add_row(r.name, r.severity, r.enforcement, r.description)
    out.print(table)


def _print_report(report: Any) -> None:
    from superkube.plan import checks

    table = Table(title=f"superkube check: {report.stack}", title_justify="left")
    for col in ("rule", "severity", "enforcement", "result"):
        table.add_column(col)
    for o in report.outcomes:
        if o.enforcement == "disabled":
            result = f"[dim]disabled: {o.reason}[/]"
        elif o.violations:
            colour = "red" if o.enforcement == "mandatory" else "yellow"
            result = f"[{colour}]{len(o.violations)} violation(s)[/]"
        else:
            result = "[green]ok[/]"
        if o.reason and o.enforcement == "advisory":
            result += f" [dim](advisory: {o.reason})[/]"
        table.add_row(o.rule.name, o.rule.severity, o.enforcement, result)
    out.print(table)
    for v in report.violations:
        out.print(
            f"[bold]{v.rule}[/] {escape(v.resource)}: {escape(v.message)}\n  fix: {escape(v.remediation)}",
            highlight=False,
        )
    out.print(checks.summary(report), highlight=False)


def policy_config(
    stack: StackOpt = "dev",
    project: ProjectOpt = None,
) -> None:
    """Write the CrossGuard policy-pack config for a stack (for `pulumi preview --policy-pack-config`)."""
    from superkube.plan import checks
    from superkube.plan import engine as planning

    try:
        root = project_dir(project)
        rules = checks.load_rules(root)
        _, spec, addresses = planning.load(root, stack)
        checks.check_overrides(spec.policy_overrides, rules)
    except SpecError as exc:
        fail(str(exc))
    shared = checks.rule_config(spec, addresses).to_dict()
    document = {}
    for rule in rules:
        override = spec.policy_overrides.get(rule.name)
        document[rule.name] = {
            "enforcementLevel": override.enforcement if override else rule.enforcement,
            **shared,
        }
    sys.stdout.write(json.dumps(document, indent=2) + "\n")
