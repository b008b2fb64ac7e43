"""A run report's Changeability section (design/changeability.py says what is measured): each
cell's figures read from its raw record (raw/reload/<cell>.json), their table
(report/tables/changeability.csv) and figure (report/figures/changeability.png, .svg).
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from experiments.design.changeability import HOPS_PER_SECOND

# The study of dynamic reverse-proxy reconfiguration (../shared/reference/reverse-proxy-reconfiguration-yuan.txt):
# per configuration request, with file rewriting and reloads, and with in-memory configuration and batching.
STUDY_MS = {"file rewriting and reloads": 46.5, "in-memory configuration, batched": 2.8}
PAPER_CLAIM = ("the paper (sections I, II, VII) argues that a central entity is easier to change than dynamic routers or sidecars, "
               "since one place holds the policy; it measures nothing about change")


def summarize(cell: dict) -> dict:
    """One cell's figures from its raw record."""
    records = cell["records"]
    new = cell["reload"]["revision"]
    mixed = [r for r in records if len(set(r["revisions"])) > 1]
    return {
        "topology": cell["topology"], "engine": cell["engine"], "services": cell["services"],
        "points": len(cell["reload"]["points"]),
        "propagation_s": cell["reload"]["seconds"], "written_s": cell["reload"]["written_seconds"],
        # Runs from before the two-step reload took the answers with the rules.
        "precomputed_s": cell["reload"].get("precomputed_seconds", cell["reload"]["seconds"]),
        "records": len(records),
        "lost": sum(1 for r in records if r["status"] != 200),
        "old": sum(1 for r in records if r["revisions"] and set(r["revisions"]) == {cell["old_revision"]}),
        "new": sum(1 for r in records if r["revisions"] and set(r["revisions"]) == {new}),
        "mixed": len(mixed),
    }


def table(raw: Path) -> pd.DataFrame:
    rows = [summarize(json.loads(path.read_text())) for path in sorted(raw.glob("*.json"))]
    return pd.DataFrame(rows)


def figure(raw: Path, figures_dir: Path) -> Path:
    """Per cell, each record's send time against the revisions its hops name (old, mixed, new),
    with the reload's start and end marked; one panel per services count."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cells = [json.loads(path.read_text()) for path in sorted(raw.glob("*.json"))]
    counts = sorted({c["services"] for c in cells})
    fig, axes = plt.subplots(1, len(counts), figsize=(7 * len(counts), 0.45 * max(len(cells), 8) + 1.5), squeeze=False)
    for ax, services in zip(axes[0], counts):
        chosen = [c for c in cells if c["services"] == services]
        for row, cell in enumerate(chosen):
            new = cell["reload"]["revision"]
            for kind, color in (("old", "#4c72b0"), ("mixed", "#dd8452"), ("new", "#55a868")):
                times = [r["t"] for r in cell["records"] if r["revisions"] and (
                    (kind == "old" and set(r["revisions"]) == {cell["old_revision"]}) or
                    (kind == "new" and set(r["revisions"]) == {new}) or
                    (kind == "mixed" and len(set(r["revisions"])) > 1))]
                ax.scatter(times, [row] * len(times), s=6, color=color, label=kind if row == 0 else None)
            lost = [r["t"] for r in cell["records"] if r["status"] != 200]
            ax.scatter(lost, [row] * len(lost), s=30, marker="x", color="red", label="lost" if row == 0 and lost else None)
            start = cell["reload_started_s"]
            ax.plot([start, start + cell["reload"]["seconds"]], [row + 0.3] * 2, color="black", linewidth=2)
            precomputed = cell["reload"].get("precomputed_seconds", cell["reload"]["seconds"])
            ax.plot([start + cell["reload"]["seconds"], start + precomputed], [row + 0.3] * 2, color="grey", linewidth=2)
        ax.set_yticks(range(len(chosen)), [f"{c['topology']} ({c['engine'].replace('envoy-', '')})" for c in chosen])
        ax.set_xlabel("record sent at (s since the first)")
        ax.set_title(f"{services} services")
        ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    figures_dir.mkdir(parents=True, exist_ok=True)
    path = figures_dir / "changeability.png"
    fig.savefig(path, dpi=110)
    fig.savefig(path.with_suffix(".svg"))
    plt.close(fig)
    return path


def blocks(run_dir: Path, figures_dir: Path) -> list[tuple]:
    """The report's Changeability section; nothing for a run without reload measurements."""
    raw = run_dir / "raw" / "reload"
    if not raw.is_dir() or not any(raw.glob("*.json")):
        return []
    frame = table(raw)
    shown = pd.DataFrame({
        "Arch.": frame["topology"], "Engine": frame["engine"], "Serv.": frame["services"], "Points": frame["points"],
        "Propagation (s)": frame["propagation_s"].map("{:.2f}".format), "of it writing (s)": frame["written_s"].map("{:.2f}".format),
        "Precomputed (s)": frame["precomputed_s"].map("{:.2f}".format),
        "Records": frame["records"], "Lost": frame["lost"], "Mixed revisions": frame["mixed"],
    })
    study = "; ".join(f"{ms:g} ms per configuration request with {how}" for how, ms in STUDY_MS.items())
    return [
        ("h2", "Changeability: a rule-set change while records flow"),
        ("p", f"Claim: {PAPER_CLAIM}. Here each topology under each engine took a change of the rule set (the US added to the EU "
              "adequacy list: a new revision everywhere) while records arrived at a steady rate ("
              f"{HOPS_PER_SECOND} hops per second: {HOPS_PER_SECOND / 5:g} records/s at 5 services, {HOPS_PER_SECOND / 50:g} at 50). "
              "Propagation: from `make reload-policy`'s start until every enforcement point decides with the new revision (each OPA "
              "reports it, each compiled Envoy serves its routes); \"of it writing\": the control plane recomputing every point's "
              "configuration (the rule set and its index, without precomputed answers) and writing bundles and route files; "
              "Precomputed: until every point holds the new revision's allowed table and compiled routes again (the rule set asked "
              "over the decision space and checked by the guard; meanwhile every hop is decided in full). "
              "Lost: records without an answer or with a status other than 200. Mixed: records whose hops name two revisions in "
              f"their path entries. For scale, the reverse-proxy reconfiguration study measured {study}; those are per configuration "
              "request of one proxy, these are one change of the whole rule set across every point."),
        ("table", shown),
        ("figure", figure(raw, figures_dir), "Every record by send time: blue, all its hops under the old revision; green, all under the "
                                             "new; orange, mixed; red ×, lost. The black bar spans the reload until every point decides with the new revision, "
                                             "the grey one until every point holds its precomputed answers."),
    ]
