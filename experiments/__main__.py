"""`complyroute experiments run ...` (or `python -m experiments run ...`), `... report <run-id>`, `... bench`,
`... reload`, `... soak`, `... capacity`, `... profile`, `... model [run]` and `... compare <run> <run>`; see README.md."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

from complyroute.policy.ruleset import RuleSet
from complyroute.runtime import targets as runtime_targets
from complyroute.runtime.kubernetes.nodes import ONE_NODE_ROLE, ROLE_LABEL
from complyroute.runtime.target import TargetError
from complyroute.topology import manifest

from experiments.design import matrix, targets
from experiments.load.mixes import MIXES
from experiments.load.openloop import ARRIVALS
from experiments.run.runner import RESULTS, Runner, dry_run, new_run_id


def refuse(message: str) -> int:
    """A command's refusal: one line on stderr, exit status 2."""
    print(f"error: {message}", file=sys.stderr)
    return 2


def run_folder(results: Path, run_id: str) -> Path:
    """A run by its id under the results folder, or by the path of its folder."""
    candidate = Path(run_id)
    return candidate if (candidate / "metadata.json").exists() else results / run_id


def cmd_run(args) -> int:
    given = {
        "topologies": args.topologies, "engines": args.engines, "rates": args.rates, "services": args.services,
        "repetitions": args.repetitions, "duration": args.duration, "warmup": args.warmup, "mix": args.mix, "load": args.load,
        "arrivals": args.arrivals, "max_in_flight": args.max_in_flight, "late_tolerance_ms": args.late_tolerance_ms, "user_rate": args.user_rate,
        "bench_records": args.bench_records, "bench_rounds": args.bench_rounds, "prime": args.prime,
        "policy": args.policy,
    }
    if args.run_id and (run_folder(args.results, args.run_id) / "metadata.json").exists():
        run_dir = run_folder(args.results, args.run_id)
        meta = json.loads((run_dir / "metadata.json").read_text())
        stored = matrix.Parameters.from_json(meta["parameters"])
        differing = matrix.conflicts(stored, profile=args.profile, **given)
        stored_target = (meta.get("target") or {}).get("target", "local")  # runs recorded before targets ran locally
        if args.target != stored_target:
            differing.append(f"--target {args.target} (the run has {stored_target})")
        if differing:
            return refuse(f"run {run_dir.name} was started with other parameters; resuming keeps its own. Differing: "
                          + "; ".join(differing))
        parameters = dataclasses.replace(stored, repetitions=max(stored.repetitions, args.repetitions or 0))
    else:
        if args.profile is None:  # the paper's matrix takes about 12 hours here: nobody starts it by leaving a flag out
            return refuse(f"a new run needs --profile ({', '.join(sorted(matrix.PROFILES))}): quick is `make experiment`'s "
                          "(about 30 minutes here), paper the paper's whole matrix (about 12 hours); a flag given replaces the profile's")
        parameters = matrix.resolve(args.profile, **given)
        run_dir = args.results / (args.run_id or new_run_id(parameters.profile))
    for name in parameters.topologies:  # a manifest its schema refuses stops the run before any cell starts
        manifest.load(name)
    if args.dry_run:
        dry_run(parameters, sys.stdout)
        return 0
    if args.capacity and keep_capacity(run_dir, args):  # a folder that is not a capacity run: refused before any cell starts
        return 2
    return Runner(run_dir, parameters, target=targets.make(args.target, args.one_node, args.entry_url)).run()


def keep_capacity(run_dir: Path, args) -> int:
    """Keep the capacity runs of --capacity in the run's folder; 2 if one is not a capacity run."""
    from experiments.report import capacity_report

    try:
        capacity_report.keep_capacity(run_dir, [run_folder(args.results, run_id) for run_id in args.capacity])
    except FileNotFoundError as error:
        return refuse(str(error))
    return 0


def cmd_report(args) -> int:
    from experiments.report.report import build  # matplotlib only when a report is made

    run_dir = run_folder(args.results, args.run_id)
    if not (run_dir / "metadata.json").exists():
        return refuse(f"no run at {run_dir} (no metadata.json)")
    if args.capacity and keep_capacity(run_dir, args) != 0:
        return 2
    paths = build(run_dir)
    print(f"report: {paths['html']}\nreport: {paths['markdown']}")
    return 0


def newest_run(results: Path) -> Path | None:
    """The most recently started run under the results folder that has a bench."""
    runs = [path.parent.parent for path in results.glob("*/raw/bench.csv") if (path.parent.parent / "metadata.json").exists()]
    return max(runs, key=lambda run: json.loads((run / "metadata.json").read_text())["created_at"], default=None)


def cmd_model(args) -> int:
    from experiments.analysis import model, model_predict
    from experiments.report import model_report  # simpy and matplotlib only when a model is made

    run_dir = run_folder(args.results, args.run_id) if args.run_id else newest_run(args.results)
    if run_dir is None:
        return refuse(f"no run with a bench under {args.results}")
    try:
        seconds = model_predict.THIS_MACHINE_SECONDS if args.seconds is None else args.seconds
        paths = model_report.build_report(run_dir, paper_cores=args.paper_cores, seconds=seconds, paper_rates=args.paper_rates,
                                          paper_services=args.paper_services,
                                          capacity_runs=[run_folder(args.results, run_id) for run_id in args.capacity or []])
    except model.ModelError as error:
        return refuse(str(error))
    print(f"model: {paths['html']}\nmodel: {paths['markdown']}")
    return 0


def cmd_compare(args) -> int:
    from experiments.report import compare  # scipy and matplotlib only when runs are compared

    run_a, run_b = run_folder(args.results, args.run_a), run_folder(args.results, args.run_b)
    out = args.out or args.results / f"compare-{run_a.name}-{run_b.name}"
    try:
        paths = compare.build(run_a, run_b, out)
    except compare.CompareError as error:
        return refuse(str(error))
    print(f"compare: {paths['html']}\ncompare: {paths['markdown']}")
    return 0


def cmd_reload(args) -> int:
    from experiments.design import changeability
    from experiments.report import changeability_report
    from experiments.report.report import build
    from experiments.report.reporting import render_html, render_markdown
    from experiments.run import changeability_run, metadata

    services = [5] if args.quick else args.services
    run_dir = run_folder(args.results, args.run_id) if args.run_id else args.results / f"reload-{time.strftime('%Y%m%d-%H%M%S')}"
    run_dir.mkdir(parents=True, exist_ok=True)
    parameters = {"services": services, "topologies": list(changeability.TOPOLOGIES), "engines": list(changeability.ENGINES),
                  "hops_per_second": changeability.HOPS_PER_SECOND, "before_s": changeability.BEFORE_S, "after_s": changeability.AFTER_S}
    (run_dir / "reload.json").write_text(json.dumps({"parameters": parameters, **metadata.describe()}, indent=1))
    changeability_run.run(run_dir, services)
    if (run_dir / "metadata.json").exists():  # an experiment run: its report gains the section
        paths = build(run_dir)
    else:
        report_dir = run_dir / "report"
        blocks = [("h1", f"complyroute changeability {run_dir.name}")] + changeability_report.blocks(run_dir, report_dir / "figures")
        report_dir.mkdir(parents=True, exist_ok=True)
        paths = {"markdown": report_dir / "report.md", "html": report_dir / "report.html"}
        paths["markdown"].write_text(render_markdown(blocks, report_dir))
        paths["html"].write_text(render_html(blocks, run_dir.name))
    print(f"report: {paths['html']}\nreport: {paths['markdown']}")
    return 0


def cmd_bench(args) -> int:
    from experiments.run import bench

    return bench.command(RuleSet.of("policies"), args.out, records=args.records, rounds=args.rounds)


def cmd_profile(args) -> int:
    from complyroute.runtime.target import runs_root
    from experiments.run import profile

    topology = matrix.topology_name(args.topology)
    if topology == matrix.BASELINE:
        # Nothing to profile, and its deployment's CPU per record is any run's baseline row.
        return refuse(f"the baseline has no OPA to profile; name an enforcing topology ({', '.join(matrix.ENFORCING)})")
    folder = args.out or runs_root() / "profile" / time.strftime("%Y%m%d-%H%M%S")
    return profile.run(topology, args.engine, args.services, args.rate, args.seconds, args.warmup, folder)


def cmd_soak(args) -> int:
    from experiments.run import soak

    if args.target != "local":
        return refuse("soak --target k8s is not supported: its faults are signals to this machine's processes by pid (SIGKILL, "
                      "SIGSTOP) with recovery timed by their supervisor and health checks, rule-set reloads it waits for, and its audit "
                      "reads the local run folder; pods have none of these here. On Kubernetes a killed container is shown failing closed "
                      "and restarted by the kubelet in tests/k8s/test_real_node_e2e.py; run soak without --target (local)")
    given = {name: value for name, value in {
        "topologies": args.topologies and [matrix.topology_name(t) for t in args.topologies], "engine": args.engine, "services": args.services,
        "rate": args.rate, "duration": args.duration, "warmup": args.warmup, "fault_every": args.fault_every, "pause_s": args.pause,
        "seed": args.seed, "user_rate": args.user_rate, "replicas": args.replicas, "fault_kinds": args.fault_kinds,
        "fault_parts": args.fault_parts}.items() if value is not None}
    if args.user_rate is not None and not 1 <= args.user_rate <= (args.rate or soak.Parameters.rate):
        return refuse(f"--user-rate {args.user_rate:g} must be at least 1 and at most the offered rate")
    try:
        parameters = soak.Parameters(**{**(soak.QUICK if args.quick else {}), **given}, restart=not args.no_restart)
        _, summaries = soak.run(parameters, args.results, run_id=args.run_id)
    except soak.SoakError as error:
        return refuse(str(error))
    return 0 if all(s["all_accounted"] and s["audit"]["clean"] for s in summaries) else 1


def cmd_capacity(args) -> int:
    from experiments.design import capacity
    from experiments.run import capacity_run

    if args.report:
        run_dir = run_folder(args.results, args.report)
        if not all((run_dir / name).exists() for name in ("metadata.json", f"raw/{capacity.STEPS_CSV}")):
            return refuse(f"no capacity run at {run_dir} (it needs metadata.json and raw/{capacity.STEPS_CSV}); an experiment run takes "
                          f"one with `python -m experiments report RUN --capacity CAPACITY_RUN`")
        paths = capacity_run.build_report(run_dir)
        print(f"capacity: report: {paths['html']}\ncapacity: report: {paths['markdown']}")
        return 0
    given = {name: value for name, value in {
        "topologies": args.topologies, "engines": args.engines, "services": args.services, "start_rate": args.start_rate,
        "max_rate": args.max_rate, "step_seconds": args.step_seconds, "step_warmup": args.step_warmup,
        "p99_bound_ms": args.p99_bound_ms, "max_steps": args.max_steps, "confirmations": args.confirmations, "prime": False if args.no_prime else None,
        "replicas": args.replicas, "work_iterations": args.work_iterations, "closing_baseline": False if args.no_closing_baseline else None}.items()
        if value is not None}
    parameters = capacity.Parameters(**given)  # a ParameterError: one line and exit 2, in main
    if args.run_id and (args.results / args.run_id).exists():
        return refuse(f"{args.results / args.run_id} already exists; name a new run with --run-id")
    code, _ = capacity_run.run(parameters, args.results, args.run_id, target=targets.make(args.target, args.one_node, args.entry_url))
    return code


def add_target_options(command: argparse.ArgumentParser) -> None:
    command.add_argument("--target", choices=runtime_targets.TARGETS, default=runtime_targets.DEFAULT,
                         help="where each deployment goes: local (processes on this machine, the default) or k8s (the current kubectl "
                              "context, as make deploy target=k8s; the namespace is deleted after each)")
    command.add_argument("--one-node", action="store_true",
                         help=f"--target k8s: render for one node that carries every role (labelled {ROLE_LABEL}={ONE_NODE_ROLE}, "
                              "as the local cluster's real node)")
    command.add_argument("--entry-url", metavar="URL",
                         help="--target k8s: the entry's address as this machine reaches it (http://host:port), instead of "
                              "kubectl port-forward to its Service")


def main(argv: list[str] | None = None, prog: str = "python -m experiments") -> int:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__)
    parser.add_argument("--results", type=Path, default=RESULTS, help=f"folder of the runs (default {RESULTS})")
    commands = parser.add_subparsers(dest="command", required=True)

    run = commands.add_parser("run", help="run the matrix (or resume a run), then write its report",
                              description="Every matrix parameter defaults to the profile's (paper unless --profile quick).")
    run.add_argument("--profile", choices=sorted(matrix.PROFILES), help="preset parameters, which a new run needs (a resumed run keeps its own)")
    run.add_argument("--topologies", nargs="+", metavar="NAME", help=f"names or aliases ({' '.join(manifest.aliases())}); default {' '.join(matrix.TOPOLOGIES)}")
    run.add_argument("--engines", nargs="+", metavar="ENGINE",
                     help=f"how the enforcing topologies decide, each run under every one given (default both: {' '.join(matrix.ENGINES)})")
    run.add_argument("--rates", nargs="+", type=int, metavar="REQ_PER_S", help="offered rates (default 100 500 1000)")
    run.add_argument("--services", nargs="+", type=int, metavar="N", help="chain lengths (default 5 10 25 50)")
    run.add_argument("--repetitions", type=int, help="repetitions of every case (default 5); with --run-id of a run that has fewer, "
                                                     "the repetitions added to it")
    run.add_argument("--duration", type=int, metavar="SECONDS", help="measured seconds per cell, after the warm-up (paper 60, quick 20)")
    run.add_argument("--warmup", type=int, metavar="SECONDS", help="seconds of load left out of the statistics (paper 10, quick 5)")
    run.add_argument("--prime", type=int, metavar="RECORDS",
                     help=f"records sent at a cell's rate on its fresh deployment before its own (at least {matrix.PRIME_MIN_SECONDS} s), "
                          f"kept in raw/<cell>/prime/ and not judged (default {matrix.DEFAULT_PRIME_RECORDS}; 0: none)"),
    run.add_argument("--mix", choices=sorted(MIXES), help="records sent: allowed (default: all through the whole chain) or mixed (1 in 5 denied); "
                                                          "classification: the classification rule set's (1 in 5 denied)")
    run.add_argument("--policy", metavar="RULE_SET", help="the rule set the enforcing topologies decide with: policies (default) or a name of "
                                                          "rule-sets/; its mix with --mix (make experiment-classification runs one quick cell)")
    run.add_argument("--load", choices=matrix.LOADS,
                     help=f"open: records sent on a schedule whatever the answers, RTT from each intended send time; closed: users that wait "
                          f"for each answer (default {matrix.DEFAULT_LOAD})")
    run.add_argument("--arrivals", choices=ARRIVALS, help=f"open loop: constant gaps or Poisson arrivals (default {matrix.DEFAULT_ARRIVALS})")
    run.add_argument("--max-in-flight", type=int, metavar="N",
                     help=f"open loop: unanswered requests at most; a send beyond it is counted as missed (default {matrix.DEFAULT_MAX_IN_FLIGHT})")
    run.add_argument("--late-tolerance-ms", type=float, metavar="MS",
                     help=f"open loop: a send the sender could not make within this of its intended time is counted as missed "
                          f"(default {matrix.DEFAULT_LATE_TOLERANCE_MS:g})")
    run.add_argument("--user-rate", type=float, metavar="REQ_PER_S",
                     help=f"closed loop: requests per second of one Locust user at most (default {matrix.DEFAULT_USER_RATE:g})")
    run.add_argument("--bench-records", type=int, metavar="N",
                     help=f"records per part and round of the bench each session takes before its cells (default {matrix.BENCH_RECORDS})")
    run.add_argument("--bench-rounds", type=int, metavar="N", help=f"rounds of that bench (default {matrix.BENCH_ROUNDS}; 0: no bench)")
    run.add_argument("--run-id", help="resume this run (finished cells are skipped), or name a new one")
    run.add_argument("--dry-run", action="store_true",
                     help="print the matrix, how long the run would take here and the disk it would need, and start nothing")
    run.add_argument("--capacity", nargs="+", metavar="CAPACITY_RUN", help="as report's --capacity, kept before the first cell")
    add_target_options(run)
    run.set_defaults(handler=cmd_run)

    report = commands.add_parser("report", help="write report.md and report.html of a run")
    report.add_argument("run_id", help="a run id under the results folder, or a run folder's path")
    report.add_argument("--capacity", nargs="+", metavar="CAPACITY_RUN",
                        help="capacity runs whose searches give the price of enforcement as a share of the baseline's capacity; kept "
                             "in the run's raw/capacity/ (replacing those kept before), so that a later report keeps the share")
    report.set_defaults(handler=cmd_report)

    bench = commands.add_parser("bench", help="CPU per request of each part of a hop beside its floor (make bench)")
    bench.add_argument("--out", type=Path, help="CSV file to write (default runs/bench/<time>/bench.csv)")
    bench.add_argument("--records", type=int, default=1500, help="sequential records per part and round (default 1500)")
    bench.add_argument("--rounds", type=int, default=3, help="rounds; every figure is the median over them (default 3)")
    bench.set_defaults(handler=cmd_bench)

    profiling = commands.add_parser("profile", help="where the OPAs' CPU goes, part by part, in a deployment under the experiment's load",
                                    description="Deploys one cell, loads it with Locust at its rate and takes a CPU profile of every "
                                                "point's OPA (pprof) over a window after the warm-up; prints ms of CPU per decision by part.")
    profiling.add_argument("--topology", default="central-entity", help="name or alias (default central-entity)")
    profiling.add_argument("--engine", default="envoy-compiled", choices=matrix.ENGINES, help="default envoy-compiled")
    profiling.add_argument("--services", type=int, default=5, help="chain length (default 5)")
    profiling.add_argument("--rate", type=int, default=100, help="offered records/s (default 100)")
    profiling.add_argument("--seconds", type=int, default=30, help="seconds profiled (default 30)")
    profiling.add_argument("--warmup", type=int, default=10, help="seconds of load before the profile (default 10)")
    profiling.add_argument("--out", type=Path, help="folder for the profiles and the table (default runs/profile/<time>)")
    profiling.set_defaults(handler=cmd_profile)

    modelling = commands.add_parser("model", help="predict RTTs from the parts' CPU costs, here and on the paper's testbed",
                                    description="Writes report/model.md and model.html of the run (default: the newest with a bench).")
    modelling.add_argument("run_id", nargs="?", help="a run id under the results folder, or a run folder's path")
    modelling.add_argument("--paper-cores", type=int, default=48, metavar="N",
                           help="hardware threads of each of the paper's service nodes (default 48; its gateway node: 56)")
    modelling.add_argument("--seconds", type=float, help="simulated seconds per cell of this machine (default 30)")
    modelling.add_argument("--capacity", nargs="+", metavar="CAPACITY_RUN",
                           help="capacity runs of this machine whose searches' capacities to set beside the model's")
    modelling.add_argument("--paper-rates", nargs="+", type=int, default=[100, 500, 1000], metavar="REQ_PER_S",
                           help="rates predicted on the paper's testbed (default 100 500 1000)")
    modelling.add_argument("--paper-services", nargs="+", type=int, default=[5, 10, 25, 50], metavar="N",
                           help="chain lengths predicted on the paper's testbed (default 5 10 25 50)")
    modelling.set_defaults(handler=cmd_model)

    comparing = commands.add_parser("compare", help="what changed from run A to run B, per case both measured, with bootstrap intervals")
    comparing.add_argument("run_a", help="the run before: a run id under the results folder, or a run folder's path")
    comparing.add_argument("run_b", help="the run after")
    comparing.add_argument("--out", type=Path, help="folder to write into (default <results>/compare-<A>-<B>)")
    comparing.set_defaults(handler=cmd_compare)

    changes = commands.add_parser("reload", help="changeability: a rule-set change while records flow, per topology, engine and services")
    changes.add_argument("--services", nargs="+", type=int, default=[5, 50], metavar="N", help="chain lengths (default 5 50)")
    changes.add_argument("--quick", action="store_true", help="5 services only (about 2 minutes)")
    changes.add_argument("--run-id", help="an experiment run to add the measurements and the report section to, or a new name")
    changes.set_defaults(handler=cmd_reload)

    soak = commands.add_parser("soak", help="a held rate through each topology while parts are killed, paused and the rules reloaded")
    soak.add_argument("--topologies", nargs="+", metavar="NAME", help=f"default: {' '.join(matrix.ENFORCING)}")
    soak.add_argument("--engine", choices=["envoy-opa", "envoy-compiled"], help="default envoy-opa")
    soak.add_argument("--services", type=int, help="chain length (default 5)")
    soak.add_argument("--rate", type=int, metavar="REQ_PER_S", help="offered rate (default 50)")
    soak.add_argument("--duration", type=int, metavar="SECONDS", help="measured seconds, in which the faults fall (default 60)")
    soak.add_argument("--warmup", type=int, metavar="SECONDS", help="seconds of load before the first fault (default 5)")
    soak.add_argument("--fault-every", type=float, metavar="SECONDS", help="seconds between faults (default 6)")
    soak.add_argument("--pause", type=float, metavar="SECONDS", help="how long a paused part stays stopped (default 2)")
    soak.add_argument("--seed", type=int, help="which parts the schedule draws (default 1)")
    soak.add_argument("--user-rate", type=float, metavar="REQ_PER_S",
                      help="each Locust user's held rate (default 10): users = rate / user rate. The soak's loop is closed, "
                           "so a user waits for its answer; lower this when RTTs near 1/user rate, or the offered rate is not kept")
    soak.add_argument("--no-restart", action="store_true", help="deploy without restarts: a killed part stays down")
    soak.add_argument("--replicas", type=int, metavar="N", help="instances of every step, alike: each hop's compliant set (default 1)")
    soak.add_argument("--fault-kinds", nargs="+", metavar="KIND", help="faults in turn: kill, pause, reload (default kill pause kill reload)")
    soak.add_argument("--fault-parts", nargs="+", metavar="KIND",
                      help="kinds of part the kills and pauses hit, in turn: service, envoy, router, opa (default all four)")
    soak.add_argument("--run-id", help="name of the run folder under the results; an existing one gains these topologies "
                                       "(one folder per topology, engine and replicas) and its report all of them")
    soak.add_argument("--quick", action="store_true", help="dynamic-router-3 only, 20 req/s, 16 s: about 40 s")
    soak.add_argument("--target", choices=runtime_targets.TARGETS, default=runtime_targets.DEFAULT,
                      help="local only (the default): faults by pid and the audit of the run folder need processes of this machine")
    soak.set_defaults(handler=cmd_soak)

    capacity = commands.add_parser("capacity", help="the highest offered rate each topology holds: a step search per topology, engine "
                                                    "and chain length, the baseline the reference (searched first and last)",
                                   description="Per topology, engine and chain length one deployment; the open-loop rate doubles from "
                                               "--start-rate while steps hold, up to --max-rate, then bisects to within 10%. A step holds "
                                               "when it achieved >= 95% of the offered rate, errors + missed sends <= 1% and p99 RTT <= "
                                               "--p99-bound-ms. Writes <results>/<run-id>/raw/steps.csv and report/capacity.md, .html.")
    capacity.add_argument("--topologies", nargs="+", metavar="NAME",
                          help=f"names or aliases ({' '.join(manifest.aliases())}); default {' '.join(matrix.ENFORCING)}; "
                               "the baseline is always searched")
    capacity.add_argument("--engines", nargs="+", metavar="ENGINE", help=f"engines of the enforcing topologies (default both: {' '.join(matrix.ENGINES)})")
    capacity.add_argument("--services", nargs="+", type=int, metavar="N", help="chain lengths (default 5 10)")
    capacity.add_argument("--start-rate", type=int, metavar="REQ_PER_S", help="the first step's offered rate (default 50)")
    capacity.add_argument("--max-rate", type=int, metavar="REQ_PER_S", help="the doubling stops here (default 2000)")
    capacity.add_argument("--step-seconds", type=int, metavar="SECONDS", help="measured seconds per step (default 10)")
    capacity.add_argument("--step-warmup", type=int, metavar="SECONDS", help="seconds of load per step before its window (default 5)")
    capacity.add_argument("--p99-bound-ms", type=float, metavar="MS", help="a held step's p99 RTT at most (default 500)")
    capacity.add_argument("--max-steps", type=int, metavar="N", help="steps of one search at most, whatever they find (default 16)")
    capacity.add_argument("--confirmations", type=int, metavar="N", help="a failed step is run again N times before its rate fails (default 1)")
    capacity.add_argument("--no-prime", action="store_true", help="no priming load: by default a search first runs one step's load at half "
                          "the start rate, not judged, so a fresh deployment's slow first seconds do not fail its first step")
    capacity.add_argument("--no-closing-baseline", action="store_true", help="search the baseline once per chain length, not first and last")
    capacity.add_argument("--replicas", type=int, metavar="N", help="instances of every step, alike: each hop's compliant set (default 1)")
    capacity.add_argument("--work-iterations", type=int, metavar="N",
                          help="SHA-256 rounds each service spends on a record (default: the manifest's workload, 100)")
    capacity.add_argument("--run-id", help="name of the new run (default capacity-<date>-<time>)")
    capacity.add_argument("--report", metavar="RUN", help="only rebuild the report of this capacity run (a run id or folder)")
    add_target_options(capacity)
    capacity.set_defaults(handler=cmd_capacity)

    args = parser.parse_args(argv)
    try:
        return args.handler(args)
    except (matrix.ParameterError, TargetError, manifest.ManifestError) as error:
        return refuse(str(error))


if __name__ == "__main__":
    sys.exit(main())
