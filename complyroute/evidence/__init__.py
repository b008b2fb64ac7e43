"""What a run proves afterwards: every instance's hash-chained audit lines checked against the
rule set (audit.py, recheck.rego), and one record's hops from the decision logs (trace.py)."""
