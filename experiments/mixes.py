"""The records Locust sends: their labels, how often each is sent, and the answer it should get.

The generated chain svc-01 .. svc-n processes for the purposes billing, analytics, care,
billing, ... (complyroute.manifest.GENERATED_PURPOSES), one EU instance per step. A record
consenting to all three is allowed through every step; one lacking a purpose is denied
(451 PURPOSE_NOT_CONSENTED) at the first hop into a service that processes for it.
"""

from __future__ import annotations

from dataclasses import dataclass

ALLOWED_LABELS = {"region": "EU", "category": "personal", "consent": "billing,analytics,care"}
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
}
