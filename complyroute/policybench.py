"""What one policy decision costs at each topology's enforcement points: `opa bench`.

For every topology at 5 and at 50 services, the enforcement point that decides the hop into
the last service evaluates the query its OPA answers for Envoy (data.complyroute.envoy.response)
with exactly the catalog slice that point holds: a sidecar knows the next step's instances, a
router its node's services and their next steps, the central entity everything. Each point
gets an allowed record and its denied twin (the same record without consent to the last
service's purpose), and the decision is checked before it is timed: a benchmark of the wrong
path measures nothing.

Printed per case: the median and p99 evaluation time over all of `opa bench`'s iterations,
and allocations per decision; then the ratio of each point's median to the smallest one,
all from this one run.
"""

from __future__ import annotations

import json
import subprocess
import tempfile
from pathlib import Path

from . import manifest, policydata
from .enforcement import POLICY_QUERY, write_data
from .manifest import GENERATED_PURPOSES, REPO
from .plan import place

OPA = REPO / "bin" / "opa"
QUERY = "data." + POLICY_QUERY.replace("/", ".")
TOPOLOGIES = ["sidecar", "dynamic-router-3", "dynamic-router-6", "central-entity"]
SIZES = [5, 50]


def envoy_input(sender: str, step: str, consent: list[str]) -> dict:
    """An ext_authz check request as Envoy sends it for a hop, with its route's context."""
    return {"attributes": {
        "request": {"http": {
            "method": "POST",
            "path": "/process",
            "headers": {
                "content-type": "application/json",
                "x-data-region": "EU",
                "x-data-category": "personal",
                "x-data-consent": ",".join(consent),
                "x-request-id": "bench-1",
            },
            "body": json.dumps({"subject": "alice", "amount": 12}),
        }},
        "contextExtensions": {"sender": sender, "step": step},
    }}


def cases(topology_name: str, services: int):
    """(point name, catalog, allowed input, denied input) for the hop into the last service."""
    topology = manifest.load(topology_name, services=services)
    last = topology.instances_of(topology.steps[-1])[0]
    sender = topology.instances_of(topology.steps[-2])[0].id
    for point in place(topology).points:
        for listener in point.deciding:
            if listener.sender == sender:
                allowed = envoy_input(sender, listener.step, list(GENERATED_PURPOSES))
                denied = envoy_input(sender, listener.step, [p for p in GENERATED_PURPOSES if p not in last.purposes])
                return point.name, point.catalog, allowed, denied
    raise RuntimeError(f"{topology_name}: no enforcement point decides the hop from {sender}")


def opa(*args: str) -> str:
    result = subprocess.run([str(OPA), *args], capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"opa {args[0]} failed: {(result.stderr or result.stdout).strip()}")
    return result.stdout


def measure(data_dir: Path, input_file: Path) -> tuple[dict, dict]:
    """The decision for one input, and `opa bench`'s figures for evaluating it."""
    common = ["--data", str(REPO / "policies"), "--ignore", "*_test.rego", "--ignore", "examples",
              "--data", str(data_dir), "--input", str(input_file)]
    decision = json.loads(opa("eval", "--format", "json", *common, QUERY))["result"][0]["expressions"][0]["value"]
    bench = json.loads(opa("bench", "--format", "json", *common, QUERY))
    return decision, bench


def outcome(decision: dict) -> str:
    headers = decision.get("headers", {})
    if decision.get("allowed"):
        return f"allowed -> {headers.get('x-complyroute-destination')}"
    return f"denied {json.loads(decision.get('body', '{}')).get('code')}"


def run() -> int:
    print(f"policy-bench: `opa bench` of {QUERY}, the hop into the last service, one run")
    header = f"{'topology':<18}{'services':>8}  {'decides at':<22}{'catalog':>8}  {'record':<8}{'decision':<34}{'median':>10}{'p99':>10}{'allocs':>8}"
    print(header)
    rows = []
    every_case = {(topology_name, services): cases(topology_name, services) for topology_name in TOPOLOGIES for services in SIZES}
    documents = policydata.opa_data({f"{t}-{n}": catalog for (t, n), (_, catalog, _, _) in every_case.items()})
    with tempfile.TemporaryDirectory() as scratch:
        for (topology_name, services), (point, catalog, allowed, denied) in every_case.items():
            data_dir = Path(scratch) / f"{topology_name}-{services}"
            write_data(data_dir, documents[f"{topology_name}-{services}"])
            for record, request in (("allowed", allowed), ("denied", denied)):
                input_file = Path(scratch) / f"{topology_name}-{services}-{record}.json"  # not under --data
                input_file.write_text(json.dumps(request))
                decision, bench = measure(data_dir, input_file)
                if decision.get("allowed") != (record == "allowed"):
                    raise RuntimeError(f"{topology_name}-{services}: the {record} record was {outcome(decision)}")
                median = bench["Extra"]["histogram_timer_rego_query_eval_ns_median"] / 1000
                p99 = bench["Extra"]["histogram_timer_rego_query_eval_ns_99%"] / 1000
                allocs = bench["MemAllocs"] / bench["N"]
                rows.append((topology_name, services, record, median))
                print(f"{topology_name:<18}{services:>8}  {point:<22}{len(catalog['instances']):>8}  {record:<8}"
                      f"{outcome(decision):<34}{median:>8.0f}µs{p99:>8.0f}µs{allocs:>8.0f}", flush=True)
    fastest = min(median for *_, median in rows)
    print(f"\nmedian / fastest median ({fastest:.0f} µs), same run:")
    for topology_name, services, record, median in rows:
        print(f"  {topology_name}-{services} {record}: {median / fastest:.2f}")
    return 0
