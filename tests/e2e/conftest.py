"""The session's pool of mixed-regions deployments, which the suites that only send records share.

A stream of make test has one entry address (127.0.0.1:8080, or <its network>.254:8080 under
COMPLYROUTE_LOOPBACK, which make test sets), so one deployment runs at a time. The enforcement,
error-contract, hostile and audit suites each used to deploy the example in every topology ×
engine for themselves (26 deployments); they now ask the pool (the `pool` marker), which deploys
a topology × engine once, when a test first asks for it, and hands the same deployment to every
test that asks for it next. The tests that use it run one topology × engine after another (this
file's pytest_collection_modifyitems), in the order of their marker's `phase`:

0. tests that need a deployment no test has sent a record to (the audit suite's: its verdict
   counts the run's records);
1. the enforcement suite, which ends with an audit verdict over what it sent;
2. the error contract;
3. the hostile suite's client and local-process attacks, then its service instances stopped
   (one EU replica of a step, every one of a step), each started again before the test ends;
4. destructive tests (`spends=True`: the enforcement suite's killed OPA): nothing runs on that
   deployment after them;
5. tests with a deployment of their own (`own=<name>`): the hostile suite's compromised service,
   which replaces ingest-eu-1's process for good (and stops the other EU replicas), and whose
   audit verdict must find only its own attack.

Every pooled deployment has receive_timeout 1 s (headers; the whole request: that plus the 2 s
decision timeout), short enough for the error contract's 408 test to wait out; the default is
what every other deployment of the suite runs with.
"""

from __future__ import annotations

import pytest

from complyroute.runtime.local import deployment

from tests.rulesets import of_manifest

from .helpers import ENFORCING, ENGINES, POOL_RECEIVE_TIMEOUT, mixed_regions

KEYS = [(topology, engine) for engine in ENGINES for topology in ENFORCING]


class Pool:
    """One deployment of the mixed-regions example at a time, by (topology, engine)."""

    def __init__(self):
        self.key = None  # (topology, engine, own)
        self.state = None
        self.loaded = None
        self.used = 0
        self.spent = False
        self.resources: dict[str, tuple[object, object]] = {}
        self.deployed = 0

    def running(self) -> bool:
        current = deployment.read_state()
        return bool(self.state and current and current["run_dir"] == self.state["run_dir"])

    def get(self, topology: str, engine: str, own: str | None = None, untouched: bool = False):
        """(state, loaded topology) of the deployment for (topology, engine), started when the one
        running is another, was spent, was replaced by another suite's, or (`untouched`) has
        been used. `own`: a deployment only the tests of that name use."""
        key = (topology, engine, own)
        if key != self.key or self.spent or not self.running() or (untouched and self.used):
            self.release()
            if deployment.read_state():
                deployment.stop()
            loaded = mixed_regions(topology, engine)
            loaded.engine["receive_timeout"] = f"{POOL_RECEIVE_TIMEOUT:g}s"
            self.state, self.loaded, self.key = deployment.deploy(loaded, of_manifest(loaded)), loaded, key
            self.used, self.spent = 0, False
            self.deployed += 1
        self.used += 1
        return self.state, self.loaded

    def resource(self, name: str, make, close):
        """Something built on the running deployment (once), closed when the deployment is released."""
        if name not in self.resources:
            self.resources[name] = (make(self.state), close)
        return self.resources[name][0]

    def release(self):
        """Close what was built on the deployment and stop it (unless another replaced it)."""
        resources, self.resources = self.resources, {}
        for thing, close in resources.values():
            close(thing)
        if self.running():
            deployment.stop()
        self.key, self.state, self.loaded = None, None, None


POOL = Pool()


def pool_marker(item):
    return item.get_closest_marker("pool")


def item_key(item) -> tuple[str, str]:
    """The (topology, engine) a pooled test asks for: its `deployed` parameter (an engine alone: sidecar)."""
    param = item.callspec.params["deployed"]
    return ("sidecar", param) if isinstance(param, str) else tuple(param)


@pytest.fixture
def pooled(request):
    """The pool's deployment for this test's `deployed` parameter, as its marker asks: (state, loaded)."""
    marker = pool_marker(request.node)
    assert marker, "a pooled test carries the pool marker"
    topology, engine = item_key(request.node)
    return POOL.get(topology, engine, own=marker.kwargs.get("own"), untouched=marker.kwargs.get("untouched", False))


@pytest.fixture
def pool():
    return POOL


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(session, config, items):
    """Pooled tests run as one block, where the first of them was, grouped by topology × engine
    (KEYS' order), within a group by phase, and otherwise in their collected order."""
    pooled = [(index, item) for index, item in enumerate(items) if pool_marker(item) and hasattr(item, "callspec")]
    if not pooled:
        return

    def order(entry):
        index, item = entry
        return KEYS.index(item_key(item)), pool_marker(item).kwargs.get("phase", 1), index

    first = pooled[0][0]
    block = [item for _, item in sorted(pooled, key=order)]
    chosen = {id(item) for _, item in pooled}
    rest = [item for item in items if id(item) not in chosen]
    before = sum(1 for item in items[:first] if id(item) not in chosen)
    items[:] = rest[:before] + block + rest[before:]


def pytest_runtest_teardown(item, nextitem):
    """A destructive test spends its deployment; the last pooled test releases the pool."""
    marker = pool_marker(item)
    if not marker:
        return
    if marker.kwargs.get("spends"):
        POOL.spent = True
    if nextitem is None or not pool_marker(nextitem):
        POOL.release()


def pytest_sessionfinish(session):
    POOL.release()
