"""`python -m experiments profile`: where an enforcing deployment's OPAs spend their CPU, part by
part, per decision, under the experiment's own load.

It deploys one cell as `experiments run` does (Loader.deploy), loads it with Locust at the cell's
rate (Loader.load), and while the load runs takes, after the warm-up, a CPU profile of every
point's OPA from its pprof endpoint (`opa run --pprof`, on the point's REST API socket, which only
the deployment's user can open) beside the process's CPU time (psutil) and its decisions (the
Envoy plugin's grpc_request_duration_seconds_count on the diagnostic socket), over the same
window. `go tool pprof -traces` lists the profile's samples with their stacks; each sample counts
for the first part in PARTS one of whose functions is on its stack, and each part's share of the
sampled CPU is applied to the process's CPU per decision: the table is ratios within one window,
in ms of that window's CPU. Nothing is compared across runs. Beside it, the whole deployment's CPU
per delivered record by kind of process (services, Envoys, OPAs, control plane) over the same
window, from the load's own CPU samples (cpu.csv): what the OPAs' part is of the enforcement.
"""

from __future__ import annotations

import csv
import re
import shutil
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import psutil

from complyroute.policy.policyfiles import OPA
from complyroute.runtime.local import deployment
from complyroute.topology import localhttp
from complyroute.topology.plan import API_SOCKET, DIAGNOSTIC_SOCKET, Endpoint

from experiments.design import matrix
from experiments.design.matrix import Cell
from experiments.run.loader import Loader

# The parts of an OPA's CPU, in the order a sample is given to one: a sample whose stack holds a
# function of several parts is the first's (signing a token is policy evaluation too, and a stack
# that grows inside it is the stack's growth, which the evaluation's depth causes, not the signing).
PARTS = (
    ("goroutine stack growth (each check's goroutine grows its stack through the evaluation)", r"^runtime\.(newstack|morestack|copystack)"),
    ("label token: io.jwt.encode_sign (key parsing, ES256)", r"topdown\.builtinJWTEncodeSign"),
    ("decision log (encoding, masking)", r"opa/v1/plugins/logs\.|system\.log"),
    ("garbage collection", r"^runtime\.(gcBgMarkWorker|gcAssistAlloc|bgsweep|bgscavenge|gcStart|gcMarkDone|gcMarkTermination|markroot)"),
    ("policy evaluation (topdown), but the token's signature", r"opa/v1/(topdown|rego)\."),
    ("check request to input (protomap, InterfaceToValue)", r"envoyauth\.(RequestToInput|protomap)|ast\.InterfaceToValue"),
    ("plugin: decision to response, metrics", r"opa-envoy-plugin/|envoyauth\."),
    ("gRPC and protobuf (unix socket)", r"google\.golang\.org/(grpc|protobuf)|golang\.org/x/net/http2"),
)
OTHER = "other: scheduler, syscalls, timers, bundle polling"
TRACE_SEPARATOR = re.compile(r"^-+\+-+$")
DURATION = re.compile(r"^\s*([0-9.]+)(ns|us|µs|ms|s)\s+(\S.*)$")
UNIT_S = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0}


@dataclass
class OpaWindow:
    """One OPA over the profiled window: its CPU, its decisions, and its samples by part."""

    point: str
    cpu_s: float
    decisions: int
    sampled_s: float
    parts_s: dict[str, float]

    @property
    def ms_per_decision(self) -> float:
        return self.cpu_s * 1000 / self.decisions if self.decisions else float("nan")

    def part_ms(self, part: str) -> float:
        """The part's share of the sampled CPU, applied to the measured CPU per decision."""
        return self.parts_s.get(part, 0.0) / self.sampled_s * self.ms_per_decision if self.sampled_s else float("nan")


def samples(traces: str) -> list[tuple[float, list[str]]]:
    """(seconds, stack from the leaf) of every sample in `go tool pprof -traces` output."""
    out, stack, value = [], [], None
    for line in traces.splitlines():
        if TRACE_SEPARATOR.match(line.strip()):
            if value is not None:
                out.append((value, stack))
            stack, value = [], None
            continue
        match = DURATION.match(line)
        if match and value is None:
            value = float(match.group(1)) * UNIT_S[match.group(2)]
            stack = [match.group(3).strip()]
        elif value is not None and line.strip():
            stack.append(line.strip())
    if value is not None:
        out.append((value, stack))
    return out


def by_part(sampled: list[tuple[float, list[str]]]) -> dict[str, float]:
    """Seconds of samples per part (PARTS, then OTHER)."""
    compiled = [(name, re.compile(pattern)) for name, pattern in PARTS]
    totals: Counter = Counter()
    for seconds, stack in sampled:
        part = next((name for name, pattern in compiled if any(pattern.search(frame) for frame in stack)), OTHER)
        totals[part] += seconds
    return dict(totals)


def decisions(diagnostic: Endpoint) -> int:
    """The checks the point's Envoy plugin has answered (its grpc_request_duration_seconds_count)."""
    status, body = localhttp.request(f"{diagnostic.url}/metrics", timeout=10)
    if status != 200:
        raise RuntimeError(f"profile: {diagnostic.url}/metrics answered {status}")
    return round(sum(float(line.rsplit(" ", 1)[1]) for line in body.decode().splitlines()
                     if line.startswith("grpc_request_duration_seconds_count")))


def traces(profile: Path) -> str:
    go = shutil.which("go")
    if go is None:
        raise RuntimeError("profile: `go` is not on PATH (make setup's prerequisite): go tool pprof reads the profiles")
    return subprocess.run([go, "tool", "pprof", "-traces", str(OPA), str(profile)], check=True, capture_output=True, text=True).stdout


def profile_opas(state: dict, seconds: int, folder: Path) -> list[OpaWindow]:
    """Every point's OPA over the next `seconds`: a CPU profile each, taken at once, beside its CPU and decisions."""
    private = Path(state["private"])
    opas = {part["name"].split("/")[0]: part["pid"] for part in state["parts"] if part["kind"] == "opa"}
    sockets = {point: (Endpoint.unix(private / point / API_SOCKET), Endpoint.unix(private / point / DIAGNOSTIC_SOCKET)) for point in opas}
    before = {point: (cpu_seconds(pid), decisions(sockets[point][1])) for point, pid in opas.items()}
    profiles: dict[str, bytes] = {}

    def take(point: str) -> None:
        status, body = localhttp.request(f"{sockets[point][0].url}/debug/pprof/profile?seconds={seconds}", timeout=seconds + 60)
        if status != 200:
            raise RuntimeError(f"profile: {point}'s OPA answered {status} for its CPU profile: {body[:200]!r}")
        profiles[point] = body

    threads = [threading.Thread(target=take, args=(point,)) for point in opas]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    windows = []
    for point, pid in opas.items():
        if point not in profiles:
            raise RuntimeError(f"profile: no CPU profile from {point}'s OPA (see above)")
        cpu, decided = cpu_seconds(pid) - before[point][0], decisions(sockets[point][1]) - before[point][1]
        path = folder / f"{point}.opa.cpu.pb.gz"
        path.write_bytes(profiles[point])
        sampled = samples(traces(path))
        windows.append(OpaWindow(point, cpu, decided, sum(s for s, _ in sampled), by_part(sampled)))
    return windows


def cpu_seconds(pid: int) -> float:
    times = psutil.Process(pid).cpu_times()
    return times.user + times.system


# The processes a cell's cpu.csv sums by kind (loader.CpuSampler), in the order the table shows them.
KINDS = (("service_s", "services"), ("envoy_s", "Envoys"), ("opa_s", "OPAs"), ("control_s", "control plane (bundle server)"))


def cpu_by_kind(cpu_rows: list[dict], request_rows: list[dict], start_ms: float, end_ms: float) -> tuple[dict[str, float], int]:
    """ms of CPU per delivered record of each kind of process (KINDS) over the samples of
    cpu.csv (loader.CpuSampler's cumulative seconds) that span [start_ms, end_ms] most closely
    from inside, and the records delivered (status 200) that Locust sent between those two
    samples: the whole deployment's CPU beside the OPAs' parts, over the same window."""
    inside = [row for row in cpu_rows if start_ms <= float(row["t_ms"]) <= end_ms]
    if len(inside) < 2:
        raise ValueError(f"profile: fewer than two CPU samples between {start_ms:.0f} and {end_ms:.0f} ms")
    first, last = inside[0], inside[-1]
    low, high = float(first["t_ms"]), float(last["t_ms"])
    delivered = sum(1 for row in request_rows if row["status"] == "200" and low <= float(row["t_send_ms"]) < high)
    if not delivered:
        raise ValueError("profile: no record delivered between the CPU samples of the window")
    return {name: (float(last[column]) - float(first[column])) * 1000 / delivered for column, name in KINDS}, delivered


def kinds_table(per_record: dict[str, float], delivered: int) -> str:
    """Markdown: ms of CPU per delivered record of each kind of process and their sum."""
    lines = ["| processes | ms of CPU per delivered record |", "|---|---:|"]
    lines += [f"| {name} | {ms:.3f} |" for name, ms in per_record.items()]
    lines.append(f"| **the deployment** | **{sum(per_record.values()):.3f}** |")
    lines.append(f"| records delivered between the samples | {delivered} |")
    return "\n".join(lines)


def table(windows: list[OpaWindow]) -> str:
    """Markdown: a row per part, per OPA its ms of CPU per decision and its share of the sampled CPU."""
    names = [name for name, _ in PARTS] + [OTHER]
    lines = ["| part | " + " | ".join(f"{w.point}: ms/decision | share" for w in windows) + " |",
             "|---|" + "---:|---:|" * len(windows)]
    for name in names:
        lines.append(f"| {name} | " + " | ".join(f"{w.part_ms(name):.3f} | {w.parts_s.get(name, 0.0) / w.sampled_s:.1%}" if w.sampled_s else "- | -"
                                                  for w in windows) + " |")
    lines.append("| **total (process CPU, psutil)** | " + " | ".join(f"**{w.ms_per_decision:.3f}** | " for w in windows) + " |")
    lines.append("| decisions in the window | " + " | ".join(f"{w.decisions} | " for w in windows) + " |")
    lines.append("| CPU the profile sampled, share of the process's | "
                 + " | ".join((f"{w.sampled_s / w.cpu_s:.0%} | " if w.cpu_s else "- | ") for w in windows) + " |")
    return "\n".join(lines)


def run(topology: str, engine: str, services: int, rate: int, seconds: int, warmup: int, folder: Path, out=sys.stdout) -> int:
    """Deploy the cell, load it for warm-up + `seconds` (+ the loader's margin), profile the OPAs
    over `seconds` after the warm-up, undeploy; print the table and keep the profiles in `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    parameters = matrix.resolve("quick", topologies=[topology], engines=[engine], rates=[rate], services=[services],
                                duration=seconds, warmup=warmup)
    cell = Cell(parameters.topologies[0], engine, rate, services, 1)
    loader = Loader(folder, parameters, out=out)
    result: dict = {}

    def work() -> None:
        with (folder / "deploy.log").open("w") as log:
            try:
                state = loader.deploy(cell, log)
                print(f"profile: {cell.label}: deployed; {warmup} s of load, then {seconds} s profiled", file=out, flush=True)
                loading = threading.Thread(target=lambda: result.update(load=loader.load(cell, folder, state, lambda _: None)))
                loading.start()
                time.sleep(warmup)
                result["start_ms"] = time.time() * 1000
                result["windows"] = profile_opas(deployment.read_state(), seconds, folder)
                result["end_ms"] = time.time() * 1000
                loading.join()
            finally:  # a failure leaves neither Locust nor the deployment running
                loader.stop_locust()
                loader.undeploy(log)

    code = loader.stop_cleanly(work, lambda outcome: None, "profile")
    if code is not None:
        return code
    windows = result["windows"]
    with (folder / "requests.csv").open() as requests:  # Locust's row per scheduled record
        request_rows = list(csv.DictReader(requests))
    statuses = Counter(row["status"] for row in request_rows)
    with (folder / "cpu.csv").open() as cpu:
        per_kind, delivered = cpu_by_kind(list(csv.DictReader(cpu)), request_rows, result["start_ms"], result["end_ms"])
    answered = ", ".join(f"{count} {status if status != '0' else 'unanswered'}" for status, count in statuses.most_common())
    text = (f"Records over the whole load (warm-up included): {answered}. A machine too busy to carry the rate "
            f"shows here as 503s and unanswered records.\n\n"
            f"OPA CPU by part, {cell.label}: {seconds} s after {warmup} s of load at {rate} records/s offered "
            f"(a point's decisions in the window are its checks answered; under envoy-compiled only the entry's OPA decides, once a record):"
            f"\n\n{table(windows)}\n\nThe whole deployment's CPU over the same window (the load's cpu.csv), per record delivered:\n\n"
            f"{kinds_table(per_kind, delivered)}\n")
    (folder / "opa-parts.md").write_text(text)
    print(text, file=out)
    print(f"profile: profiles and table in {folder}", file=out)
    return 0
