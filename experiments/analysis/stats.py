"""Statistics of a run, with pandas: per cell, pooled per case (Table I), W Avg, spread,
the cost of enforcement against the baseline, and where the time goes.

Terms:
- a *cell* is one repetition of one case; a *case* is (topology, engine, rate, services). The
  baseline enforces nothing: its engine is "none", and it is measured once per rate and
  services, the reference of both engines.
- the *window* of a cell is [t0 + warmup, t0 + warmup + duration) where t0 is its first
  request's intended send time; requests intended before it are the warm-up and are left out.
  In the closed loop a request is intended when it is sent.
- the RTT is measured from the intended send time (open loop: coordinated omission
  corrected); the service time from the actual send. In the closed loop they are the same.
- a request is *missed* when the open loop's sender could not make it on time (late beyond its
  tolerance, or the in-flight cap reached): scheduled, never sent, counted apart.
- a sent request is an *error* when its status is not the one its record should get (200, or
  451 for a record the mix has denied); RTT statistics cover the *delivered* requests: records
  meant to go through the whole chain that got their 200.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from experiments.design.matrix import (BASELINE, COMPILED_ENGINE, ENGINE_OF_OLDER_RUNS, ENGINES, LOAD_OF_OLDER_RUNS, MAX_ERROR_RATE,
                                       MAX_REPETITION_CV, MIN_ACHIEVED_SHARE, P99_BOUND_MS, REFERENCE_ENGINE, TOPOLOGIES, load_label)
from experiments.load.timing import DURATIONS, HOP_PARTS, HOP_SEPARATOR

# The baseline's engine in the tables: a value, not a missing one, since pandas leaves rows
# with a missing key out of every grouping.
NO_ENGINE = "none"
CASE = ["topology", "engine", "rate", "services"]
CELL = [*CASE, "repetition"]
RTT_COLUMNS = ["min", "q1", "median", "q3", "p95", "p99", "max", "mean", "std"]
PERCENTILES = {0.25: "q1", 0.5: "median", 0.75: "q3", 0.95: "p95", 0.99: "p99"}
REQUEST_DTYPES = {"t_intended_ms": "float64", "t_send_ms": "float64", "rtt_ms": "float64", "service_time_ms": "float64",
                  "status": "int16", "missed": "object", "record": "category", "expected": "int16", "hops": "float32",
                  **{name: "float32" for name in DURATIONS}}


# ---- one cell -----------------------------------------------------------------------

def read_requests(cell_dir: Path) -> pd.DataFrame:
    """A cell's requests.csv.gz, without the times of each hop (hop_times reads them: a run's
    requests of 50 services would hold 150 numbers a row). One recorded before the open loop has
    neither intended times nor misses: its requests were intended when sent, and its RTT is their
    service time."""
    path = cell_dir / "requests.csv.gz"
    columns = pd.read_csv(path, nrows=0).columns
    requests = pd.read_csv(path, usecols=[name for name in columns if name not in HOP_PARTS],
                           dtype={name: kind for name, kind in REQUEST_DTYPES.items() if name in columns})
    if "t_intended_ms" not in columns:
        requests = requests.assign(t_intended_ms=requests["t_send_ms"], service_time_ms=requests["rtt_ms"], missed=None)
    return requests


def in_window(requests: pd.DataFrame, warmup_s: float, duration_s: float) -> pd.DataFrame:
    """The requests intended in the measured window (after the warm-up, before the end)."""
    start = requests["t_intended_ms"].min() + warmup_s * 1000
    end = start + duration_s * 1000
    return requests[(requests["t_intended_ms"] >= start) & (requests["t_intended_ms"] < end)]


def delivered(requests: pd.DataFrame) -> pd.DataFrame:
    """Records meant for the whole chain that went through it (the paper's RTT)."""
    return requests[(requests["record"] == "allowed") & (requests["status"] == 200)]


def rtt_statistics(rtt: pd.Series) -> dict:
    """count, min, Q1, median, Q3, p95, p99, max, mean, std (sample, ddof 1) of RTTs in ms.

    Quantiles are pandas' default (linear interpolation between closest ranks).
    """
    described = rtt.describe(percentiles=list(PERCENTILES)).rename(index={f"{p:.0%}": name for p, name in PERCENTILES.items()})
    return {"count": int(described["count"]), **{name: float(described[name]) for name in RTT_COLUMNS}}


def is_saturated(achieved_rate: float, offered_rate: float, error_rate: float, p99_ms: float | None = None) -> bool:
    """Less than 95% of the target rate reached, more than 1% errors, or, for an open loop (whose
    rate holds while its queue grows: `p99_ms` given), a p99 RTT beyond P99_BOUND_MS. A closed
    loop's users bound its RTT, so its p99 says nothing of capacity (None)."""
    return bool(achieved_rate < MIN_ACHIEVED_SHARE * offered_rate or error_rate > MAX_ERROR_RATE
                or (p99_ms is not None and p99_ms > P99_BOUND_MS))


CPU_KINDS = ("service", "envoy", "opa", "control")  # the kinds of deployment parts cpu.csv splits by (control: the bundle server)


def cpu_cores(cpu: pd.DataFrame, start_ms: float, end_ms: float) -> dict:
    """Cores kept busy over [start, end) by the machine, Locust, the deployment, the rest, and
    each kind of deployment part (NaN for runs recorded before cpu.csv split by kind)."""
    names = ["cpu_machine", "cpu_locust", "cpu_deployment", "cpu_other", *(f"cpu_{kind}" for kind in CPU_KINDS)]
    inside = cpu[(cpu["t_ms"] >= start_ms) & (cpu["t_ms"] <= end_ms)]
    if len(inside) < 2:
        return dict.fromkeys(names, float("nan"))
    change = inside.iloc[-1] - inside.iloc[0]
    seconds = change["t_ms"] / 1000
    cores = {
        "cpu_machine": change["machine_busy_s"] / seconds,
        "cpu_locust": change["locust_s"] / seconds,
        "cpu_deployment": change["deployment_s"] / seconds,
    }
    cores["cpu_other"] = cores["cpu_machine"] - cores["cpu_locust"] - cores["cpu_deployment"]
    for kind in CPU_KINDS:
        cores[f"cpu_{kind}"] = change[f"{kind}_s"] / seconds if f"{kind}_s" in change else float("nan")
    return cores


def load_of(meta: dict) -> str:
    """A cell's load as cell.json records it ("open" or "closed"; closed before the open loop existed)."""
    return meta.get("load", LOAD_OF_OLDER_RUNS)


def cell_statistics(requests: pd.DataFrame, meta: dict) -> dict:
    """One cell's load, misses, errors and RTT statistics from all its requests (warm-up included).

    The achieved rate counts the requests sent in the window. In the open loop it is set
    against the requests its schedule held (with Poisson arrivals a little more or less than
    the offered rate): a cell that missed more than 5% of its sends, or whose p99 RTT is beyond
    P99_BOUND_MS (its queue grew through the window), is saturated. In the closed loop it is set
    against the offered rate."""
    measured = in_window(requests, meta["warmup_s"], meta["duration_s"])
    was_missed = measured["missed"].notna()
    sent = measured[~was_missed]
    errors = int((sent["status"] != sent["expected"]).sum())
    error_rate = errors / len(sent) if len(sent) else 1.0
    achieved = len(sent) / meta["duration_s"]
    target = len(measured) / meta["duration_s"] if load_of(meta) == "open" else meta["offered_rate"]
    timed = delivered(sent)
    rtt = rtt_statistics(timed["rtt_ms"])
    return {
        "scheduled": len(measured),
        "missed": int(was_missed.sum()),
        "miss_rate": float(was_missed.mean()) if len(measured) else 0.0,
        "requests": len(sent),
        "errors": errors,
        "error_rate": error_rate,
        "offered_rate": meta["offered_rate"],
        "achieved_rate": achieved,
        "saturated": is_saturated(achieved, target, error_rate, rtt["p99"] if load_of(meta) == "open" else None),
        "users": meta["users"],
        **rtt,
        "median_service_time": float(timed["service_time_ms"].median()),
        "send_lag_p99_ms": float((sent["t_send_ms"] - sent["t_intended_ms"]).quantile(0.99)),
    }


def summarize_cell(cell_dir: Path) -> dict:
    """A finished cell's statistics (what the runner prints after it)."""
    return cell_statistics(read_requests(cell_dir), json.loads((cell_dir / "cell.json").read_text()))


# ---- a run --------------------------------------------------------------------------

def identity(cell: dict) -> dict:
    """A cell as cell.json or failed.json records it, with its engine as the tables name it: the
    baseline's "none", and envoy-opa for an enforcing cell recorded before engines were run."""
    engine = NO_ENGINE if cell["topology"] == BASELINE else cell.get("engine") or ENGINE_OF_OLDER_RUNS
    return {**cell, "engine": engine}


def load_run(run_dir: Path) -> tuple[pd.DataFrame, pd.DataFrame, list[dict]]:
    """(cells, measured requests, failed cells) of a run.

    cells: one row per finished cell with its statistics, CPU use and deployment figures;
    requests: the in-window requests of every finished cell, with the cell's columns.
    """
    cell_rows, request_frames = [], []
    for cell_json in sorted((run_dir / "raw").glob("*/cell.json")):
        meta = json.loads(cell_json.read_text())
        requests = read_requests(cell_json.parent)
        measured = in_window(requests, meta["warmup_s"], meta["duration_s"])
        start = requests["t_intended_ms"].min() + meta["warmup_s"] * 1000
        cpu = pd.read_csv(cell_json.parent / "cpu.csv")
        cell = identity(meta["cell"])
        cell_rows.append({
            **cell,
            "load": load_label(load_of(meta), meta.get("arrivals")),
            **cell_statistics(requests, meta),
            **cpu_cores(cpu, start, start + meta["duration_s"] * 1000),
            "parts": meta["deployment"]["parts"],
            "bring_up_s": meta["deployment"]["bring_up_seconds"],
            "memory_mib": meta["deployment"]["memory_mib"]["total"],
        })
        request_frames.append(measured.assign(**cell))
    failed = [json.loads(path.read_text()) for path in sorted((run_dir / "raw").glob("*/failed.json"))]
    cells = order(pd.DataFrame(cell_rows, columns=None if cell_rows else CELL))
    requests = pd.concat(request_frames, ignore_index=True) if request_frames else pd.DataFrame(columns=[*REQUEST_DTYPES, *CELL])
    return cells, requests, failed


def order(frame: pd.DataFrame, by: list[str] = CELL) -> pd.DataFrame:
    """Rows in the paper's order: topology (CE, DR_3, DR_6, SA, baseline), engine (envoy-opa,
    compiled), rate, services; or in the order of the columns `by`, each in its own order."""
    if frame.empty:
        return frame
    ranks = {"topology": {name: position for position, name in enumerate(TOPOLOGIES)},
             "engine": {name: position for position, name in enumerate([*ENGINES, NO_ENGINE])}}
    keys = [key for key in by if key in frame.columns]
    return frame.sort_values(keys, key=lambda column: column.map(ranks[column.name]) if column.name in ranks else column).reset_index(drop=True)


def pooled(cells: pd.DataFrame, requests: pd.DataFrame) -> pd.DataFrame:
    """Table I: every case's RTT statistics over its repetitions' delivered requests pooled
    (as the paper did), with its load figures and whether any repetition was saturated."""
    rtt = delivered(requests).groupby(CASE, observed=True)["rtt_ms"].describe(percentiles=list(PERCENTILES))
    rtt = rtt.rename(columns={f"{p:.0%}": name for p, name in PERCENTILES.items()})[["count", *RTT_COLUMNS]]
    load = cells.groupby(CASE).agg(
        load=("load", "first"),
        repetitions=("repetition", "size"),
        scheduled=("scheduled", "sum"),
        missed=("missed", "sum"),
        requests=("requests", "sum"),
        errors=("errors", "sum"),
        offered_rate=("offered_rate", "first"),
        achieved_rate=("achieved_rate", "mean"),
        saturated=("saturated", "any"),
    )
    table = load.join(rtt, how="left").reset_index()
    table["error_rate"] = table["errors"] / table["requests"]
    return order(table)


def w_avg(table: pd.DataFrame) -> pd.DataFrame:
    """W Avg per topology, engine and rate: the mean over the service counts n run of median
    RTT_n / n (the paper's (RTT_5/5 + RTT_10/10 + RTT_25/25 + RTT_50/50) / 4 when all four ran)."""
    per_service = table.assign(median_per_service=table["median"] / table["services"])
    grouped = per_service.groupby(["topology", "engine", "rate"])
    result = grouped.agg(w_avg=("median_per_service", "mean"), any_saturated=("saturated", "any")).reset_index()
    result["services_run"] = grouped["services"].agg(lambda n: " ".join(str(v) for v in sorted(n))).to_numpy()
    return order(result)


def repetition_spread(cells: pd.DataFrame) -> pd.DataFrame:
    """Per case, the median RTT of each repetition and their coefficient of variation
    (standard deviation / mean of those medians; undefined for one repetition).

    cv_flagged: a case none of whose repetitions is saturated with a CV above 10%. A saturated
    case's medians measure how far its queue grew, which varies by nature; it is not flagged."""
    grouped = cells.groupby(CASE)
    spread = grouped.agg(load=("load", "first"), repetitions=("median", "size"), saturated=("saturated", "any"),
                         mean_of_medians=("median", "mean"), std_of_medians=("median", "std")).reset_index()
    spread["cv"] = spread["std_of_medians"] / spread["mean_of_medians"]
    spread["cv_flagged"] = ~spread["saturated"] & (spread["cv"] > MAX_REPETITION_CV)
    spread["medians"] = grouped["median"].agg(lambda m: " ".join(f"{v:.3f}" for v in m)).to_numpy()
    return order(spread)


def enforcement_cost(table: pd.DataFrame) -> pd.DataFrame:
    """Per case, (median RTT - the baseline's median RTT at the same rate and services) / hops;
    both engines against the same baseline.

    Every hop into a service is decided (the entry's hop and the n - 1 between services),
    so hops = services. Empty when the run has no baseline.
    """
    baseline = table[table["topology"] == BASELINE][["rate", "services", "median"]].rename(columns={"median": "baseline_median"})
    enforcing = table[table["topology"] != BASELINE][[*CASE, "median", "saturated"]]
    cost = enforcing.merge(baseline, on=["rate", "services"], how="inner")
    cost["hops"] = cost["services"]
    cost["cost_per_hop"] = (cost["median"] - cost["baseline_median"]) / cost["hops"]
    return order(cost)


def cpu_per_record(cells: pd.DataFrame) -> pd.DataFrame:
    """Per case, the CPU the deployment spent per record (ms): in all, and by kind of part.

    Cores kept busy divided by the achieved rate, per cell, then the mean over repetitions.
    A capacity measure: unlike the RTT it hardly depends on queueing, so it still compares
    saturated cases. Against the baseline at the same rate and services, (total - the
    baseline's total) / hops is the CPU that enforcement costs per hop.
    """
    per_cell = cells[CELL].assign(
        total_ms=cells["cpu_deployment"] * 1000 / cells["achieved_rate"],
        **{f"{kind}_ms": cells[f"cpu_{kind}"] * 1000 / cells["achieved_rate"] for kind in CPU_KINDS},
        saturated=cells["saturated"],
    )
    cpu = per_cell.groupby(CASE, observed=True).agg(
        repetitions=("repetition", "count"), saturated=("saturated", "any"),
        total_ms=("total_ms", "mean"), **{f"{kind}_ms": (f"{kind}_ms", "mean") for kind in CPU_KINDS},
    ).reset_index()
    baseline = cpu[cpu["topology"] == BASELINE][["rate", "services", "total_ms"]].rename(columns={"total_ms": "baseline_total_ms"})
    cpu = cpu.merge(baseline, on=["rate", "services"], how="left")
    cpu["enforcement_per_hop_ms"] = ((cpu["total_ms"] - cpu["baseline_total_ms"]) / cpu["services"]).where(cpu["topology"] != BASELINE)
    return order(cpu)


def time_split(requests: pd.DataFrame) -> pd.DataFrame:
    """Where the time of a delivered request goes, per case (means, which add up to the mean RTT).

    Inside the services: service_ms. Outside them: between services (forward + back) and at
    the edge (entry + exit). These add up to the service time, from the actual send; the
    sender's lateness (open loop: actual − intended send time) makes up the rest of the RTT. The baseline has no enforcement, so its time outside the services
    is transit (loopback, the entry's plain proxy, the client); what a topology spends outside
    its services beyond that, at the same rate and services, is enforcement (decisions and
    proxying). Gap-based too: the median gap from one service's t_out to the next one's t_in,
    per gap, against the baseline's.
    """
    timed = delivered(requests)
    timed = timed[timed["hops"] == timed["services"]]
    with_gap = timed.assign(forward_gap_ms=timed["forward_ms"] / (timed["services"] - 1).where(timed["services"] > 1))
    grouped = with_gap.groupby(CASE, observed=True)
    split = grouped[["rtt_ms", "service_time_ms", *DURATIONS]].mean()
    split["send_lag_ms"] = split["rtt_ms"] - split["service_time_ms"]
    split["forward_gap_median_ms"] = grouped["forward_gap_ms"].median()
    split = split.reset_index()
    split["outside_ms"] = split[["forward_ms", "back_ms", "entry_ms", "exit_ms"]].sum(axis=1)
    baseline = split[split["topology"] == BASELINE][["rate", "services", "outside_ms", "forward_gap_median_ms"]]
    split = split.merge(baseline.rename(columns={"outside_ms": "transit_ms", "forward_gap_median_ms": "baseline_forward_gap_median_ms"}),
                        on=["rate", "services"], how="left")
    split["enforcement_ms"] = split["outside_ms"] - split["transit_ms"]
    split["enforcement_per_hop_ms"] = split["enforcement_ms"] / split["services"]
    split["enforcement_per_gap_ms"] = split["forward_gap_median_ms"] - split["baseline_forward_gap_median_ms"]
    return order(split)


def records(requests: pd.DataFrame) -> pd.DataFrame:
    """Per case, record kind and status: how many requests and their median RTT (a mix with
    denials: a denied record's RTT covers the hops up to the one that stopped it)."""
    grouped = requests.groupby([*CASE, "record", "expected", "status"], observed=True)["rtt_ms"]
    return order(grouped.agg(requests="size", median="median").reset_index())


def engine_comparison(table: pd.DataFrame, cpu: pd.DataFrame) -> pd.DataFrame:
    """Per enforcing topology, rate and services run under both engines: the compiled engine
    beside envoy-opa in median RTT, achieved rate and CPU per record, each as compiled /
    envoy-opa (under 1: the compiled engine took less time or CPU; over 1: it carried more
    records), with the baseline's median RTT and CPU per record, the floor both approach."""
    measures = table[[*CASE, "median", "achieved_rate", "saturated"]].merge(cpu[[*CASE, "total_ms"]], on=CASE, how="left")
    per_engine = {engine: measures[measures["engine"] == engine].drop(columns="engine") for engine in (REFERENCE_ENGINE, COMPILED_ENGINE)}
    both = per_engine[REFERENCE_ENGINE].merge(per_engine[COMPILED_ENGINE], on=["topology", "rate", "services"],
                                              suffixes=("_opa", "_compiled"))
    for measure in ("median", "achieved_rate", "total_ms"):
        both[f"{measure}_ratio"] = both[f"{measure}_compiled"] / both[f"{measure}_opa"]
    baseline = measures[measures["topology"] == BASELINE][["rate", "services", "median", "total_ms"]]
    both = both.merge(baseline.rename(columns={"median": "baseline_median", "total_ms": "baseline_total_ms"}),
                      on=["rate", "services"], how="left")
    return order(both)


HOP_COLUMNS = ["in_ms", "service_ms", "out_ms"]  # hop_times' columns, of HOP_PARTS in their order


def hop_times(run_dir: Path) -> pd.DataFrame:
    """Per case and hop (1: the first service), the mean time of its delivered records, that went
    through every service, spent reaching the hop (in_ms), inside it (service_ms) and getting its
    answer back (out_ms), repetitions pooled; with the mean RTT and the sender's lateness (RTT −
    service time, the open loop's), so that a case's hops and lateness add up to its mean RTT.
    Cells recorded before requests.csv.gz kept each hop's times have none."""
    sums, counts, whole = [], {}, []
    for cell_json in sorted((run_dir / "raw").glob("*/cell.json")):
        meta = json.loads(cell_json.read_text())
        path = cell_json.parent / "requests.csv.gz"
        if not set(HOP_PARTS) <= set(pd.read_csv(path, nrows=0).columns):
            continue
        requests = pd.read_csv(path, usecols=["t_intended_ms", "t_send_ms", "rtt_ms", "service_time_ms", "status", "missed", "record", "hops",
                                              *HOP_PARTS], dtype={name: "string" for name in HOP_PARTS})
        if "missed" in requests:
            requests = requests[requests["missed"].isna()]
        cell = identity(meta["cell"])
        timed = delivered(in_window(requests, meta["warmup_s"], meta["duration_s"]))
        timed = timed[timed["hops"] == cell["services"]]
        if timed.empty:
            continue
        key = tuple(cell[name] for name in CASE)
        counts[key] = counts.get(key, 0) + len(timed)
        whole.append({**dict(zip(CASE, key)), "rtt_sum": timed["rtt_ms"].sum(), "lag_sum": (timed["rtt_ms"] - timed["service_time_ms"]).sum()})
        per_hop = {column: timed[part].str.split(HOP_SEPARATOR, expand=True).astype(float).sum()
                   for part, column in zip(HOP_PARTS, HOP_COLUMNS)}
        sums.append(pd.DataFrame({**dict(zip(CASE, key)), "hop": range(1, cell["services"] + 1),
                                  **{column: values.to_numpy() for column, values in per_hop.items()}}))
    if not sums:
        return pd.DataFrame(columns=[*CASE, "hop", *HOP_COLUMNS, "records", "rtt_ms", "send_lag_ms"])
    hops = pd.concat(sums).groupby([*CASE, "hop"], as_index=False)[HOP_COLUMNS].sum()
    totals = pd.DataFrame(whole).groupby(CASE, as_index=False)[["rtt_sum", "lag_sum"]].sum()
    totals["records"] = [counts[tuple(row)] for row in totals[CASE].itertuples(index=False)]
    hops = hops.merge(totals, on=CASE)
    for column in HOP_COLUMNS:
        hops[column] = hops[column] / hops["records"]
    hops["rtt_ms"] = hops.pop("rtt_sum") / hops["records"]
    hops["send_lag_ms"] = hops.pop("lag_sum") / hops["records"]
    return order(hops, by=[*CASE, "hop"])
