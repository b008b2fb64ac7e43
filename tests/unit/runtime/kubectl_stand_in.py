"""kubectl answered from memory, for the tests of the Kubernetes target (tests/unit/runtime/test_runtime_targets.py)
and of the experiments on it (tests/unit/experiments/design/test_targets.py): no cluster, no process."""

import json
import subprocess

from complyroute.runtime.kubernetes.nodes import ONE_NODE_ROLE, ROLE_LABEL

CONTEXT = "local"
SERVER = "https://10.250.250.2:36443"


def node(name: str, **labels) -> dict:
    return {"metadata": {"name": name, "labels": labels}}


class Kubectl:
    """kubectl_output answered from memory: a context, its nodes, the namespaces that exist and
    the pods of each; every call recorded."""

    def __init__(self, nodes=None, context=CONTEXT, answering=True):
        self.context, self.answering = context, answering
        self.nodes = [node("complyroute-node", **{ROLE_LABEL: ONE_NODE_ROLE})] if nodes is None else nodes
        self.namespaces: set[str] = set()
        self.calls: list[tuple] = []

    def __call__(self, *args):
        self.calls.append(args)
        done = lambda out, code=0, err="": subprocess.CompletedProcess(args, code, out, err)
        if args[:2] == ("config", "current-context"):
            return done(self.context + "\n" if self.context else "", 0 if self.context else 1)
        if args[:2] == ("config", "view"):
            return done(SERVER if self.context else "")
        if args[:2] == ("get", "nodes"):
            if not self.answering:
                return done("", 1, "The connection to the server 10.250.250.2:36443 was refused - did you specify the right host or port?\n")
            return done(json.dumps({"items": self.nodes}))
        if args[:2] == ("get", "namespace"):
            return done("{}" if args[2] in self.namespaces else "", 0 if args[2] in self.namespaces else 1)
        if args[2:4] == ("get", "pods"):
            return done(json.dumps({"items": [{"spec": {"nodeName": "complyroute-node"}}] * 7}))
        raise AssertionError(f"unexpected kubectl {args}")
