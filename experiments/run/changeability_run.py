"""`python -m experiments reload`: each cell of the changeability measurement
(design/changeability.py) deployed, sent records at a steady rate across a change of its rule
set, and undeployed; its raw record in raw/reload/<cell>.json, the table of every cell in
report/tables/changeability.csv (report/changeability_report.py).
"""

from __future__ import annotations

import json
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pandas as pd

from complyroute.client import send
from complyroute.policy.ruleset import RuleSet
from complyroute.runtime.local import deployment, reload
from complyroute.topology import manifest

from experiments.design.changeability import AFTER_S, BEFORE_S, ENGINES, HOPS_PER_SECOND, LABELS, TOPOLOGIES, changed_rule_set
from experiments.report.changeability_report import summarize, table


def steady_records(url: str, rate: float, stop: threading.Event, started: float) -> list[dict]:
    """Send a record every 1/rate s until `stop` (each at its time, answered or not); every outcome."""
    outcomes: list[dict] = []

    def one(scheduled: float) -> None:
        try:
            answer = send(url, LABELS, {"subject": "changeability"}, timeout=30)
            revisions = [hop.get("revision") for hop in answer.body["path"]] if answer.status == 200 and answer.body else []
            outcomes.append({"t": scheduled, "status": answer.status, "revisions": revisions, "id": answer.request_id})
        except OSError as error:
            outcomes.append({"t": scheduled, "status": None, "error": str(error), "revisions": []})

    with ThreadPoolExecutor(max_workers=32) as pool:
        tick = 0
        while not stop.is_set():
            scheduled = started + tick / rate
            delay = scheduled - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            pool.submit(one, scheduled - started)
            tick += 1
    return sorted(outcomes, key=lambda o: o["t"])


def run_cell(topology: str, engine: str, services: int, shipped: RuleSet, changed: RuleSet, raw: Path, out=sys.stdout) -> dict:
    """Deploy with `shipped`, reload `changed` while records flow; the cell's summary row."""
    name = f"{topology}_{engine}_n{services}"
    if deployment.read_state():
        deployment.stop(out=open("/dev/null", "w"))
    state = deployment.deploy(manifest.load(topology, services=services, engine=engine), shipped, out=open("/dev/null", "w"))
    rate = HOPS_PER_SECOND / services
    try:
        old_revision = state["revision"]
        stop, started = threading.Event(), time.monotonic()
        records: list[dict] = []
        sender = threading.Thread(target=lambda: records.extend(steady_records(state["entry_url"], rate, stop, started)))
        sender.start()
        time.sleep(BEFORE_S)
        reload_started = time.monotonic() - started
        result = reload.reload_policy(changed, out=open("/dev/null", "w"))
        time.sleep(AFTER_S)
        stop.set()
        sender.join(60)
    finally:
        deployment.stop(out=open("/dev/null", "w"))
    cell = {"topology": topology, "engine": engine, "services": services, "rate": rate, "old_revision": old_revision,
            "reload_started_s": reload_started, "reload": result, "records": records}
    (raw / f"{name}.json").write_text(json.dumps(cell))
    row = summarize(cell)
    print(f"reload: {name}: propagation {row['propagation_s']:.2f} s (writing {row['written_s']:.2f} s), "
          f"precomputed answers after {row['precomputed_s']:.2f} s, "
          f"{row['records']} records at {rate:g}/s, {row['lost']} lost, {row['mixed']} mixed", file=out)
    return row


def run(run_dir: Path, services: list[int], topologies=TOPOLOGIES, engines=ENGINES, out=sys.stdout) -> pd.DataFrame:
    raw = run_dir / "raw" / "reload"
    raw.mkdir(parents=True, exist_ok=True)
    cells = [(t, e, n) for n in services for t in topologies for e in engines]
    with tempfile.TemporaryDirectory(prefix="complyroute-changeability-") as scratch:
        shipped, changed = RuleSet.of("policies"), RuleSet.of(changed_rule_set(Path(scratch)))  # made once for every cell
        for number, (topology, engine, count) in enumerate(cells, 1):
            print(f"reload: cell {number}/{len(cells)}", file=out)
            run_cell(topology, engine, count, shipped, changed, raw, out)
    frame = table(raw)
    tables = run_dir / "report" / "tables"
    tables.mkdir(parents=True, exist_ok=True)
    frame.to_csv(tables / "changeability.csv", index=False)
    return frame
