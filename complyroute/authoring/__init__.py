"""For whoever writes rule sets: what a change of the rules changes (policydiff.py) and what a
decision costs (policybench.py)."""
