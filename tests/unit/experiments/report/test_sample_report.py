"""The sample report (experiments/sample/, linked from the README) is what the report code makes of
the sample run's raw data: rebuilt from a copy of it, its Markdown, page, tables and figures are the
committed ones. A change to the report that changes the sample fails here until the sample is
rebuilt on purpose: `python -m experiments report experiments/sample`."""

import re
import shutil
from pathlib import Path

import pandas as pd
import pytest

from complyroute.topology.manifest import REPO
from experiments.analysis import stats
from experiments.load.timing import HOP_PARTS
from experiments.report.report import build

SAMPLE = REPO / "experiments" / "sample"


def differences(committed: Path, fresh: Path) -> list[str]:
    """The report's files that differ between two report folders, or that only one has. SVGs are
    compared by name only: matplotlib writes the time it drew them into each."""
    names = {path.relative_to(folder).as_posix() for folder in (committed, fresh) for path in folder.rglob("*") if path.is_file()}
    return sorted(name for name in names
                  if not (committed / name).exists() or not (fresh / name).exists()
                  or (not name.endswith(".svg") and (committed / name).read_bytes() != (fresh / name).read_bytes()))


@pytest.fixture(scope="module")
def rebuilt(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("sample") / SAMPLE.name
    shutil.copytree(SAMPLE, run_dir, ignore=shutil.ignore_patterns("report", "README.md"))
    build(run_dir)
    return run_dir / "report"


def test_the_committed_sample_is_what_its_raw_data_makes(rebuilt):
    assert differences(SAMPLE / "report", rebuilt) == [], "rebuild it: python -m experiments report experiments/sample"


def test_a_changed_line_or_a_missing_figure_is_a_difference(rebuilt, tmp_path):
    changed = tmp_path / "report"
    shutil.copytree(rebuilt, changed)
    (changed / "report.md").write_text((changed / "report.md").read_text().replace("## Findings", "## Findings, edited"))
    (changed / "figures" / "hops.png").unlink()
    assert differences(rebuilt, changed) == ["figures/hops.png", "report.md"]


def test_the_sample_opens_with_the_findings():
    markdown = (SAMPLE / "report" / "report.md").read_text()
    findings, rest = markdown.index("## Findings"), markdown.index("## Read this first")
    section = markdown[findings:rest]
    assert findings < rest and "**100 req/s, 5 services**:" in section
    assert "the deployment's CPU per record is" in section and re.search(r"Kendall's τ = [+-]\d", section)  # a τ, not only "undefined"
    assert "the model on the paper's testbed" in section and "Why: " in section
    assert "doi:10.1109/SCC.2019.00044" in section
    # the price per engine in CPU and in the baseline's capacity (raw/capacity/ keeps the search), and what the evidence costs
    for engine in ("envoy-opa", "compiled"):
        price = next(line for line in section.splitlines() if line.startswith(f"- **{engine}**: the deployment's CPU per record"))
        assert "its searched capacity is" in price and "(capacity run `capacity-sample`)" in price, price
    assert "a deciding hop's access log and hop counters:" in section and "the entry's decision log:" in section


def test_each_records_hop_times_add_up_to_its_rtt():
    """Per record, from the raw rows: the hops' in, service and out times plus the sender's lateness
    are its RTT within 5%; per case, the report's hop table adds up to the mean RTT alike."""
    for cell_dir in sorted((SAMPLE / "raw").glob("*/")):
        if not (cell_dir / "requests.csv.gz").exists():
            continue
        rows = pd.read_csv(cell_dir / "requests.csv.gz", dtype={part: "string" for part in HOP_PARTS})
        delivered = stats.delivered(rows[rows["missed"].isna()])
        hops = sum(delivered[part].str.split(" ", expand=True).astype(float).sum(axis=1) for part in HOP_PARTS)
        lateness = delivered["t_send_ms"] - delivered["t_intended_ms"]
        assert len(delivered) and ((hops + lateness - delivered["rtt_ms"]).abs() <= 0.05 * delivered["rtt_ms"]).all(), cell_dir.name
    table = pd.read_csv(SAMPLE / "report" / "tables" / "hops.csv")
    per_case = table.groupby(stats.CASE)
    total = per_case[["in_ms", "service_ms", "out_ms"]].sum().sum(axis=1) + per_case["send_lag_ms"].first()
    assert ((total - per_case["rtt_ms"].first()).abs() <= 0.05 * per_case["rtt_ms"].first()).all()
