"""The records Locust sends: their labels (by name; the headers are the rule set's, its label
schema), how often each is sent, and the answer it should get.

The generated chain svc-01 .. svc-n processes for the purposes billing, analytics, care,
billing, ... (complyroute.topology.manifest.GENERATED_PURPOSES), one EU instance per step. Under the
shipped rule set a record consenting to all three is allowed through every step; one lacking a
purpose is denied (451 PURPOSE_NOT_CONSENTED) at the first hop into a service that processes
for it. Under the classification rule set (rule-sets/classification, the mix of that name) the
generated instances hold no clearance, so a public record goes through every step and an
internal one is denied at the first hop (451 CLEARANCE_INSUFFICIENT).
"""

from __future__ import annotations

from dataclasses import dataclass

# Labels as every enforcement point writes them on (canonical: a multiple label's values sorted,
# compliance.canonical_labels), which the entry's quick path looks up. With the purposes in the
# generated order instead ("billing,analytics,care"), every record missed the entry's table and
# its OPA decided it in full: 2.42 and 2.57 ms of OPA CPU per record against 1.72 and 1.60 (a
# central entity of 5 services under the compiled engine at 100 req/s, alternating, one machine).
ALLOWED_LABELS = {"region": "EU", "category": "personal", "consent": "analytics,billing,care"}
PUBLIC = {"classification": "public"}
BODY = {"subject": "subject-1", "reading": 42}


@dataclass(frozen=True)
class Record:
    kind: str
    labels: dict
    weight: int
    denied_at_hop: int | None  # the hop (1 = into svc-01) an enforcing topology stops it at

    def expected_status(self, enforcing: bool, services: int) -> int:
        """451 where an enforcing topology stops it; the baseline lets every record through."""
        if enforcing and self.denied_at_hop is not None and self.denied_at_hop <= services:
            return 451
        return 200


MIXES: dict[str, list[Record]] = {
    # The paper's case: every record goes through the whole chain, so RTT covers all services.
    "allowed": [Record("allowed", ALLOWED_LABELS, 1, None)],
    # One record in five is denied: at svc-01 (billing) or at svc-02 (analytics).
    "mixed": [
        Record("allowed", ALLOWED_LABELS, 8, None),
        Record("denied-hop-1", {**ALLOWED_LABELS, "consent": "analytics,care"}, 1, 1),
        Record("denied-hop-2", {**ALLOWED_LABELS, "consent": "billing,care"}, 1, 2),
    ],
    # The second rule set's: one record in five denied at svc-01.
    "classification": [
        Record("allowed", PUBLIC, 4, None),
        Record("denied-hop-1", {"classification": "internal"}, 1, 1),
    ],
}
# The rule set a mix is written for (policyfiles.rule_set); the others are the shipped one's.
POLICY_OF_MIX = {"classification": "classification"}


def policy_of(mix: str) -> str:
    return POLICY_OF_MIX.get(mix, "policies")


def check_record(mix: str) -> dict:
    """The labels of a record the mix's rule set lets through the whole chain."""
    return next(record.labels for record in MIXES[mix] if record.denied_at_hop is None)
