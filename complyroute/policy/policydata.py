"""What each enforcement point's OPA loads beside the rule set, derived by the rule set itself.

The compliance policy does not read a point's catalog as the control plane writes it: it reads
an index of it, data.complyroute.index, shaped for the lookups a decision makes. Package
complyroute.indexing (policies/complyroute/indexing/indexing.rego) derives that index from the
catalog and the reference data; this module has OPA evaluate the derivation ahead of time, for
every point of a deployment in one `opa eval`, and hands back the documents to write.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from complyroute.policy.policyfiles import OPA, POLICIES, ignore_flags

QUERY = "data.complyroute.indexing.documents"
YIELDING_NICENESS = 10
# An `opa eval` here is a batch that lives seconds (a decision space: thousands of decisions):
# Go's collector left off until the heap reaches the limit, not at every doubling of the live
# heap. On a walkthrough listener's 3,072 decisions: 1.9 CPU-s, not 2.8, at 277 MB, not 92.
BATCH_GC = {"GOGC": "off", "GOMEMLIMIT": "256MiB"}


class PolicyDataError(RuntimeError):
    """OPA could not evaluate a query over the rule set; the message carries OPA's."""


def evaluate(query: str, input_document: dict, policies: Path = POLICIES, modules: tuple[Path, ...] = (),
             yielding: bool = False) -> object:
    """The value of `query` over the rule set (plus `modules`, queries kept beside their Python)
    for `input_document`, in one `opa eval`; None when the query is undefined. `yielding`: at a
    lower CPU priority (nice 10), for work that runs beside a deployment's data path (a
    reload's second step) and should not slow its decisions down."""
    command = [str(OPA), "eval", "--format", "json", "--data", str(policies), *ignore_flags()]
    for module in modules:
        command += ["--data", str(module)]
    result = subprocess.run(command + ["--stdin-input", query], input=json.dumps(input_document), capture_output=True, text=True,
                            env={**os.environ, **BATCH_GC}, preexec_fn=(lambda: os.nice(YIELDING_NICENESS)) if yielding else None)
    if result.returncode != 0:
        raise PolicyDataError((result.stderr or result.stdout).strip())
    answers = json.loads(result.stdout).get("result")
    return answers[0]["expressions"][0]["value"] if answers else None


def opa_data(catalogs: dict[str, dict], policies: Path = POLICIES) -> dict[str, dict]:
    """{point: the data document its OPA loads at the root} for every {point: catalog}, in one OPA run.

    `policies` is the rule set the points run: its indexing package and its reference data
    derive the documents. A rule set without the package (a stand-in that allows everything,
    say) reads no data of its own, and every point gets an empty document.
    """
    if not catalogs:
        return {}
    try:
        documents = evaluate(QUERY, {"catalogs": catalogs}, policies)
    except PolicyDataError as error:
        raise PolicyDataError(f"OPA could not derive the enforcement points' data: {error}") from None
    return {point: {} for point in catalogs} if documents is None else documents
