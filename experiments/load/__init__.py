"""The load a cell receives, as Locust makes it: the records sent and the answer each should
get (mixes.py), when they are sent (openloop.py: the open loop's schedule, its pacing and
misses, the RTT from the intended time), how an answer's timestamps split its round trip
(timing.py), and the Locust users and per-request hook that send them (locustfile.py: Locust
runs it as a file, `-f experiments/load/locustfile.py`, so its imports are absolute).

The lowest layer of the experiments: it imports nothing else of them."""
