"""The experiments' reports, each built from a run folder alone (metadata.json and raw/), so
that it can be rebuilt at any time: what every report shares (reporting.py: the paper's
reference values, colours, number formats, figures saved, Markdown and self-contained HTML from
a list of blocks); a run's report (report.py, with its tables, report_tables.py, its figures,
report_figures.py, and its Changeability section, changeability_report.py); a capacity run's
(capacity_report.py); the model's section (model_report.py); and two runs compared
(compare.py: the changes with their bootstrap intervals).

Above analysis/, whose figures they show; below run/, which writes a run's report at its end."""
