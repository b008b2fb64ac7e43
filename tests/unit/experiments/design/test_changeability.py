"""The changeability figures derived from a cell's raw record (experiments/report/changeability_report.py)."""

import json

from experiments.report import changeability_report

OLD, NEW = "c0ffee", "c0ffee-dirty.123456789abc"


def cell(records):
    return {"topology": "sidecar", "engine": "envoy-opa", "services": 3, "rate": 40, "old_revision": OLD,
            "reload_started_s": 3.0, "reload": {"revision": NEW, "seconds": 0.7, "written_seconds": 0.2, "points": {"a": 0.5, "b": 0.7}},
            "records": records}


def record(t, revisions, status=200):
    return {"t": t, "status": status, "revisions": revisions}


def test_records_under_one_revision_are_neither_mixed_nor_lost_allowed():
    row = changeability_report.summarize(cell([record(1.0, [OLD] * 3), record(4.0, [NEW] * 3)]))
    assert (row["records"], row["old"], row["new"], row["mixed"], row["lost"]) == (2, 1, 1, 0, 0)
    assert (row["propagation_s"], row["written_s"], row["points"]) == (0.7, 0.2, 2)


def test_a_record_decided_by_two_revisions_is_mixed_and_a_failed_one_lost_denied():
    records = [record(3.1, [OLD, NEW, NEW]), record(3.2, [], status=None), record(3.3, [], status=503)]
    row = changeability_report.summarize(cell(records))
    assert (row["mixed"], row["lost"], row["old"], row["new"]) == (1, 2, 0, 0)


def test_report_blocks_table_and_figure_from_raw_cells(tmp_path):
    raw = tmp_path / "raw" / "reload"
    raw.mkdir(parents=True)
    (raw / "sidecar_envoy-opa_n3.json").write_text(json.dumps(cell([record(1.0, [OLD] * 3), record(3.2, [OLD, NEW, NEW])])))
    blocks = changeability_report.blocks(tmp_path, tmp_path / "figures")
    kinds = [block[0] for block in blocks]
    assert kinds == ["h2", "p", "table", "figure"]
    table = blocks[2][1]
    assert list(table["Mixed revisions"]) == [1] and list(table["Lost"]) == [0]
    assert (tmp_path / "figures" / "changeability.png").stat().st_size > 1000
    assert "46.5 ms" in blocks[1][1] and "2.8 ms" in blocks[1][1]
    assert changeability_report.blocks(tmp_path / "elsewhere", tmp_path / "figures") == []  # no measurements, no section
