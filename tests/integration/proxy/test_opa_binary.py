"""bin/opa, as make setup builds it from tools/opa/main.go: the Envoy plugin's gRPC server takes
checks on lasting worker goroutines, one per thread the OPA runs Go on (GOMAXPROCS, a point's
concurrency), so that a check does not start on a new goroutine whose small stack Go copies at
every doubling as the evaluation deepens (docs/cost.md). Counted in the goroutine profile of a
real `opa run`, started with an enforcement point's own arguments (policyfiles.server_args, whose
--pprof serves the profile on the REST API's socket)."""

import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from complyroute.policy.policyfiles import OPA, server_args, system_policy_files
from complyroute.proxy.opa import POLICY_QUERY
from complyroute.topology import localhttp
from complyroute.topology.plan import Endpoint

WORKER = "google.golang.org/grpc.(*Server).serverWorker("


def stream_workers(gomaxprocs: int, plugin: bool) -> int:
    """The goroutines of a started `opa run --server` that wait in grpc-go's stream worker loop."""
    folder = Path(tempfile.mkdtemp(prefix="opa-", dir="/tmp"))  # a unix socket's path is short
    api = Endpoint.unix(folder / "api.sock")
    config = folder / "config.json"
    plugins = {"envoy_ext_authz_grpc": {"addr": Endpoint.unix(folder / "grpc.sock").listen, "path": POLICY_QUERY}}
    config.write_text(json.dumps({"plugins": plugins} if plugin else {}))
    # As a point runs it: its REST API asks the system policies (policies/system), pprof included.
    arguments = server_args(api, Endpoint.unix(folder / "diagnostic.sock"), str(config), [str(path) for path in system_policy_files()])
    server = subprocess.Popen([str(OPA), *arguments],
                              env={**os.environ, "GOMAXPROCS": str(gomaxprocs)}, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                status, body = localhttp.request(f"{api.url}/debug/pprof/goroutine?debug=2", timeout=5)
                break
            except OSError:
                assert server.poll() is None, server.stderr.read().decode()
                assert time.monotonic() < deadline, "opa run did not answer on its REST API socket within 30 s"
                time.sleep(0.1)
        assert status == 200, body[:200]
        return sum(WORKER in goroutine for goroutine in body.decode().split("\n\n"))
    finally:
        server.terminate()
        server.wait(10)
        shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.parametrize("gomaxprocs", [1, 2])
def test_the_plugin_takes_checks_on_a_stream_worker_per_go_thread_allowed(gomaxprocs):
    assert stream_workers(gomaxprocs, plugin=True) == gomaxprocs


def test_an_opa_without_the_plugin_has_no_stream_worker_denied():
    assert stream_workers(2, plugin=False) == 0
