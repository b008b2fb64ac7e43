"""complyroute control plane: `complyroute <command>`, or `python -m complyroute <command>` (make wraps each command).

deploy, status, reload-policy, undeploy, audit and trace take --target local|k8s: processes on
this machine (the default) or the current kubectl context.

`complyroute experiments <command>` runs the experiments (`python -m experiments <command>` alike).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import subprocess
import sys
from pathlib import Path

from complyroute.authoring import newruleset, policybench, policydiff, policytest
from complyroute.client import send
from complyroute.evidence import audit, trace
from complyroute.policy import labels, policyfiles
from complyroute.policy.ruleset import RuleSet
from complyroute.runtime import targets
from complyroute.runtime.local import deployment, reload, supervision
from complyroute.runtime.target import DeployFailed, ReloadError, Target, TargetError
from complyroute.topology import manifest

DEMO_MANIFEST = "topologies/examples/mixed-regions.yaml"
DEMO_RECORDS = [
    ("EU personal record: stays in the EU", {"region": "EU", "category": "personal", "consent": "care,billing"}),
    ("US personal record: may use US instances", {"region": "US", "category": "personal", "consent": "care,billing"}),
    ("EU health record: the store step has no certified instance", {"region": "EU", "category": "health", "consent": "care,billing"}),
    ("EU personal record without consent to billing", {"region": "EU", "category": "personal", "consent": "care"}),
    ("record without labels: goes nowhere", {}),
]


RULE_SET_HELP = "the rule set: policies, the name of one in rule-sets/, or a folder (default: policies/)"


def rule_set_choice(value: str) -> str:
    """A --policies value, as chosen: checked here, made into a RuleSet by the verb (rule_set_of)."""
    try:
        policyfiles.source_of(value)
    except policyfiles.RuleSetError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return value


def rule_set_of(chosen: str | Path) -> RuleSet:
    """The rule set `chosen` names, made once here (completed, dated, its labels read) and handed to
    whatever configures points with it: deploy, render, reload-policy. One whose labels are
    unusable is refused here, before anything is deployed or changed."""
    try:
        return RuleSet.of(chosen)
    except labels.LabelSchemaError as error:
        raise policyfiles.RuleSetError(f"the rule set {chosen} cannot be used; nothing was deployed or changed: {error}") from None


def add_target(command: argparse.ArgumentParser) -> None:
    command.add_argument("--target", choices=targets.TARGETS, default=targets.DEFAULT,
                         help="local: processes on this machine (the default); k8s: the current kubectl context")


def target_of(args, **options) -> Target:
    """The target --target names, with those of `options` the command line gave (None: not given);
    an option of the other target is a TargetError."""
    return targets.make(args.target, **{keyword: value for keyword, value in options.items() if value is not None})


def topology_of(args) -> manifest.Topology | None:
    return manifest.load(args.topology) if args.topology else None


def cmd_deploy(args) -> int:
    target = target_of(args, restart=False if args.no_restart else None, image=args.image, one_node=args.one_node or None,
                       ready_timeout=args.timeout)
    topology = manifest.load(args.topology, args.services, engine=args.engine)
    target.deploy(topology, rule_set_of(args.policies or topology.policy))
    return 0


def cmd_render(args) -> int:
    from complyroute.runtime.kubernetes import render

    topology = manifest.load(args.topology, args.services, engine=args.engine)
    folder = deployment.runs_root() / "k8s" / f"{topology.name}-{len(topology.instances)}"
    output = folder.with_suffix(".yaml")
    output.parent.mkdir(parents=True, exist_ok=True)
    try:
        text = render.render(topology, folder, rule_set_of(topology.policy), image=args.image or render.SERVICE_IMAGE, one_node=args.one_node)
    except render.RenderError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    render.write_private(output, text)  # it holds the parts' keys
    print(f"render: {topology.name} with {len(topology.instances)} services -> {output} (kustomization in {folder})")
    return 0


def cmd_status(args) -> int:
    return target_of(args).status(topology_of(args))


def cmd_reload_policy(args) -> int:
    target, topology = target_of(args, reload_timeout=args.timeout), topology_of(args)
    target.reload_policy(topology, rule_set_of(args.policies or target.deployed_rule_set(topology)))
    return 0


def cmd_undeploy(args) -> int:
    return target_of(args).undeploy_all()


def cmd_audit(args) -> int:
    return audit.main(args.runs or audit.run_folders(target_of(args).run_folders("audit")))


def cmd_trace(args) -> int:
    target_of(args).run_folders("trace")  # a target whose runs are not on this machine has nothing to trace here
    return trace.main(args.request_id, args.run_dir)


def cmd_demo(args) -> int:
    state = deployment.read_state()
    if not state or state["manifest"] != str(manifest.resolve(DEMO_MANIFEST)):
        if state:
            deployment.stop()
        topology = manifest.load(DEMO_MANIFEST)
        deployment.deploy(topology, rule_set_of(topology.policy))
        state = deployment.read_state()
    print(f"\nSending records to {state['entry_url']}:\n")
    for title, labels in DEMO_RECORDS:
        answer = send(state["entry_url"], labels, {"subject": "alice", "reading": 42})
        print(f"- {title}\n    {answer.summary()}")
    print(f"\nAudit logs: {state['run_dir']}/audit/   Stop it all: make undeploy")
    return 0


def cmd_watch_policy(args) -> int:
    try:
        reload.watch(args.policies)
    except KeyboardInterrupt:
        pass
    return 0


def cmd_policy_check(args) -> int:
    return policytest.check(args.path, args.opa, args.regal)


def cmd_policy_test(args) -> int:
    return policytest.test(args.paths, args.opa, args.threshold)


def cmd_new_rule_set(args) -> int:
    try:
        folder = newruleset.scaffold(args.name, Path(args.dir) if args.dir else None)
    except newruleset.NewRuleSetError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(f"complyroute: rule set {args.name} written to {folder}; next: make policy-test policy={folder}")
    return 0


def cmd_decide(args) -> int:
    """One decision of the rule set for one input, as OPA prints it."""
    return subprocess.run([args.opa, *policyfiles.decide_args(args.input, args.catalog, policyfiles.rule_set(args.policies))]).returncode


# Entry points of this group add a command of their own parser, `main(argv, prog) -> int`: the
# experiments register theirs (pyproject.toml), which stand on the control plane, so that it
# never imports them.
COMMANDS_GROUP = "complyroute.commands"


def added_commands() -> dict[str, importlib.metadata.EntryPoint]:
    """The commands installed packages add, by name."""
    return {entry.name: entry for entry in importlib.metadata.entry_points(group=COMMANDS_GROUP)}


def program_name() -> str:
    """How the user called us: the console script `complyroute`, or `python -m complyroute`."""
    return "complyroute" if Path(sys.argv[0]).name == "complyroute" else "python -m complyroute"


def version_text() -> str:
    """What --version prints: complyroute's version, the checkout's git revision, and the versions
    of OPA, Envoy and Node it runs."""
    from importlib.metadata import version

    from complyroute.runtime.local.rendering import NODE, envoy_binary

    def first_line(command: list[str]) -> str:
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired) as error:
            return f"not available ({error})"
        return (done.stdout or done.stderr).strip().splitlines()[0] if done.returncode == 0 else "not available"

    revision = first_line(["git", "-C", str(manifest.REPO), "describe", "--always", "--dirty"])
    return "\n".join([
        f"complyroute {version('complyroute')} ({revision})",
        f"opa: {first_line([str(policyfiles.OPA), 'version']).removeprefix('Version: ')}",
        f"envoy: {first_line([envoy_binary(), '--version']).split('version: ')[-1]}",
        f"node: {first_line([str(NODE), '--version'])}",
    ])


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    prog = program_name()
    if argv[:1] == ["--version"]:
        print(version_text())
        return 0
    added = added_commands()
    if argv[:1] and argv[0] in added:  # an added command: its own parser, options and help
        return added[argv[0]].load()(argv[1:], prog=f"{prog} {argv[0]}")
    parser = argparse.ArgumentParser(prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="store_true", help="print the version, the git revision and the versions of the tools it runs")
    commands = parser.add_subparsers(dest="command", required=True)
    for name, entry in sorted(added.items()):
        commands.add_parser(name, help=f"the commands of {entry.module.partition('.')[0]}: `{name} --help` lists them")

    deploy = commands.add_parser("deploy", help="start a topology and wait until every part is ready: processes on this machine, "
                                                "or (--target k8s) applied to the current kubectl context in its own namespace")
    add_target(deploy)
    deploy.add_argument("--topology", required=True, help="manifest name, alias or path")
    deploy.add_argument("--services", help="number of service instances, or a manifest whose services to deploy (overrides the manifest's)")
    deploy.add_argument("--engine", choices=manifest.ENGINES, help="how enforcement points decide (overrides the manifest's engine.kind)")
    deploy.add_argument("--policies", type=rule_set_choice, help=RULE_SET_HELP.replace("policies/", "the manifest's `policy`, else policies/"))
    deploy.add_argument("--no-restart", action="store_true",
                        help="local: a part that dies stays down (by default supervisord starts it again at once)")
    deploy.add_argument("--image", default=None,
                        help="k8s: the service image, name[:tag][@sha256:digest] (default: complyroute/service:<its version>)")
    deploy.add_argument("--one-node", action="store_true",
                        help="k8s: every pod on the one node labelled complyroute.io/role=all (all roles on one node)")
    deploy.add_argument("--timeout", help="k8s: how long to wait for the pods to be ready (default 300s)")
    deploy.set_defaults(run=cmd_deploy)

    render = commands.add_parser("render", help="write a topology's Kubernetes manifests to a file")
    render.add_argument("--topology", required=True)
    render.add_argument("--services")
    render.add_argument("--engine", choices=manifest.ENGINES)
    render.add_argument("--image", default=None, help="the service image, name[:tag][@sha256:digest] (default: complyroute/service:<its version>)")
    render.add_argument("--one-node", action="store_true",
                        help="every pod on the one node labelled complyroute.io/role=all (all roles on one node)")
    render.set_defaults(run=cmd_render)

    undeploy = commands.add_parser("undeploy", help="stop the current deployment (k8s: delete every complyroute namespace of the "
                                                    "current kubectl context)")
    add_target(undeploy)
    undeploy.set_defaults(run=cmd_undeploy)
    status = commands.add_parser("status", help="show the parts of the current deployment (k8s: the pods of the topologies deployed to "
                                                "the current kubectl context): ready, restarts")
    add_target(status)
    status.add_argument("--topology", help="k8s: only this manifest's pods (name, alias or path)")
    status.set_defaults(run=cmd_status)
    audit_runs = commands.add_parser(
        "audit", help="verify every audit chain of runs, re-check every line against the rules, join each record's lines into its path, "
                      "print a verdict per run and in total")
    add_target(audit_runs)
    audit_runs.add_argument("runs", nargs="*", type=Path, help="run folders (default: every one under runs/)")
    audit_runs.set_defaults(run=cmd_audit)

    commands.add_parser("demo", help="deploy the mixed-regions example and send sample records").set_defaults(run=cmd_demo)

    reload_policy = commands.add_parser("reload-policy", help="apply the rule set to the running deployment without restarting anything "
                                                              "(k8s: as its bundle and route ConfigMaps only, no pod rolled; not waited for)")
    add_target(reload_policy)
    reload_policy.add_argument("--topology", help="k8s: the manifest (name, alias or path) it was deployed with")
    reload_policy.add_argument("--policies", type=rule_set_choice,
                               help=RULE_SET_HELP.replace("policies/", "the one deployed"))
    reload_policy.add_argument("--timeout", type=float, help="local: seconds to wait for every point to decide with it (default 120)")
    reload_policy.set_defaults(run=cmd_reload_policy)
    trace_record = commands.add_parser("trace", help="each hop of one record: the deciding point, labels, decision, revision, audit line")
    add_target(trace_record)
    trace_record.add_argument("request_id", help="the record's id (the x-request-id of its answer)")
    trace_record.add_argument("--run", dest="run_dir", type=Path, help="run folder (default: runs/current, else the newest)")
    trace_record.set_defaults(run=cmd_trace)
    diff = commands.add_parser("policy-diff", help="list every decision the rule set in policies/ would make differently from the one at a git ref")
    diff.add_argument("--base", required=True, help="git ref of the rule set to compare with (HEAD, a commit, a branch)")
    diff.add_argument("--topology", default=policydiff.WALKTHROUGH, help="manifest whose enforcement points to ask (default: the walkthrough's)")
    diff.add_argument("--services", help="number of service instances, or a manifest whose services to use")
    diff.add_argument("--policies", type=rule_set_choice, default="policies", help=RULE_SET_HELP)
    diff.add_argument("--format", choices=["text", "json"], default="text")
    diff.set_defaults(run=lambda a: policydiff.main(a.base, a.topology, a.services, a.policies, a.format == "json"))
    watch_policy = commands.add_parser("watch-policy", help="reload the running deployment whenever the rule set changes")
    watch_policy.add_argument("--policies", type=rule_set_choice, help=RULE_SET_HELP.replace("policies/", "the deployment's"))
    watch_policy.set_defaults(run=cmd_watch_policy)

    policy_test = commands.add_parser("policy-test", help="the policy tests, then their coverage against a threshold")
    policy_test.add_argument("--opa", default=str(policyfiles.OPA))
    policy_test.add_argument("--threshold", type=float, default=95, help="least share of lines covered, %% (default 95)")
    policy_test.add_argument("paths", nargs="+")
    policy_test.set_defaults(run=cmd_policy_test)

    decide = commands.add_parser("decide", help="the rule set's decision for one input, in the direct form (policies/README.md)")
    decide.add_argument("--opa", default=str(policyfiles.OPA))
    decide.add_argument("--input", required=True, help="a hop as JSON, such as policies/examples/eu-personal-allowed.json")
    decide.add_argument("--catalog", required=True, help="the instances as JSON, such as policies/examples/catalog.json")
    decide.add_argument("--policies", type=rule_set_choice, default="policies", help=RULE_SET_HELP)
    decide.set_defaults(run=cmd_decide)

    policy_check = commands.add_parser("policy-check", help="opa check --strict and Regal of a rule set, with the platform's parts it lacks")
    policy_check.add_argument("--opa", default=str(policyfiles.OPA))
    policy_check.add_argument("--regal", default=str(policyfiles.REGAL))
    policy_check.add_argument("path")
    policy_check.set_defaults(run=cmd_policy_check)

    new_rule_set = commands.add_parser("new-rule-set", help="write a rule set of your own that passes make policy-test as written: "
                                       "its labels, index fields and one exclusion, with tests (policies/README.md)")
    new_rule_set.add_argument("name", help="its name: lowercase letters, digits and '-'")
    new_rule_set.add_argument("dir", nargs="?", help="the folder to write it under (default rule-sets/)")
    new_rule_set.set_defaults(run=cmd_new_rule_set)

    commands.add_parser("policy-bench", help="what one decision costs at each topology's enforcement points (opa bench)").set_defaults(
        run=lambda a: policybench.run())

    args = parser.parse_args(argv)
    try:
        return args.run(args)
    except (manifest.ManifestError, supervision.DeploymentError, audit.AuditError, ReloadError, policydiff.PolicyDiffError, trace.TraceError,
            TargetError, DeployFailed, policyfiles.RuleSetError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
