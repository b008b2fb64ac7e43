"""Running the experiments: what deploys, loads and collects into a run folder. One deployment
and its Locust load, stopped cleanly (loader.py); the matrix's cells in turn, resumable
(runner.py); the capacity search's steps (capacity_run.py); a soak under faults (soak.py), of
compliant sets too (sets.py); a rule-set change while records flow (changeability_run.py);
`make bench`, the CPU of each part of a hop beside its floor, on processes of its own
(bench.py, bench_parts.py); and what a run was measured with (metadata.py).

The top layer below the command line (__main__.py): a run writes its report (report/) when it
ends."""
