"""What the integration tests share across pytest-xdist's workers."""

import fcntl

import pytest

from complyroute.engines import precompute


@pytest.fixture(scope="session", autouse=True)
def one_worker_asks_opa_for_each_answer(tmp_path_factory, worker_id):
    """OPA's answers over a decision space are kept in build/decision-space (precompute.evaluate_split),
    but two workers asking for the same ones at once both miss it: the 50-service renders of
    several files, the walkthrough's policy diffs of test_policydiff, test_precompute and
    test_walkthrough (each ask up to a minute of CPU here). Each ask takes a lock named by its
    cache entry, in a folder the run's workers share (the parent of each one's base temporary
    folder, pytest-xdist's worker_id "master" when there is one process): the first asks, the
    others wait and read its answers."""
    base = tmp_path_factory.getbasetemp()
    locks = (base if worker_id == "master" else base.parent) / "decision-space-locks"
    locks.mkdir(exist_ok=True)
    ask = precompute.evaluate_split

    def asked_once(query: str, space: dict, policies):
        with open(locks / precompute._cache_key(query, space, policies), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file is closed
            return ask(query, space, policies)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(precompute, "evaluate_split", asked_once)
        yield
