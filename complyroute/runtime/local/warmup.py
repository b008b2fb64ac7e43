"""Ready means deciding: `deploy` and `reload-policy` return only once every deciding listener of
every enforcement point has decided one record, the warm-up.

A part that answers its health check has decided nothing yet: its Envoy opens its gRPC
connection to its OPA on the first record, and its OPA prepares the query it decides with on the
first decision after it activates a bundle. On a busy machine the first records after a deploy
were answered 503 DECISION_UNAVAILABLE, in a flow's first 1.25 s.

The warm-up is one unlabelled record (`POST /process`, body `{}`) at each deciding listener, sent
as its sender would send it: with mutual TLS, with the sender's certificate (a listener admits
its sender only; the control plane's own, spiffe://complyroute/control, fails the handshake),
and, with label tokens, at a listener after the entry, with a token as the entry issues one,
naming no label and this listener's audience (without one, jwt_authn refuses the record before
OPA is asked). The control plane issued those credentials and the token key into the run folder
(a process of the deploying user can pose as any part: docs/architecture.md), as `make bench`
plays the entry's part; no listener admits anything it did not before.

The rules deny an unlabelled record at the listener (400, LABEL_MISSING) under both engines (the
compiled engine's matcher has no route for it and asks OPA): it reaches no service and leaves no
audit line. Its decision shows only in the point's decision log (when on), under the record id
that state.json's `warm_up` keeps. A listener has decided once it answers with OPA's denial,
which names the revision the points decide with; anything else (503 DECISION_UNAVAILABLE, no
answer) is asked again until the deadline, and then the deploy or the reload fails naming the
point and its logs.
"""

from __future__ import annotations

import functools
import hashlib
import http.client
import json
import ssl
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from complyroute.runtime.local import polling, rendering
from complyroute.topology.plan import Plan
from complyroute.trust import identity, pki

WARM_UP_TIMEOUT_S = 30.0  # how long a deploy waits for every listener to decide its warm-up record
RECORD = b"{}"
ASK_TIMEOUT_S = 5.0  # one ask: past a point's decision timeout (2 s by default), after which its Envoy answers 503
TOKEN_LIFETIME_S = 60
DENIED = 400  # an unlabelled record: a record-level violation (LABEL_MISSING)


class WarmUpError(RuntimeError):
    """A deciding listener that did not decide its warm-up record in time; the message names it."""


@dataclass(frozen=True)
class Listener:
    """A deciding listener, as its sender reaches it."""

    point: str
    name: str
    host: str
    port: int
    tls: identity.TlsFiles | None  # the sender's credential (mutual TLS); None: plain HTTP
    audience: str | None  # what a label token must name here; None: the listener takes none

    @property
    def label(self) -> str:
        return f"{self.point} (listener {self.name}, {self.host}:{self.port})"


def listeners(plan: Plan, point_trust: dict[str, identity.PointTrust], run_dir: Path) -> list[Listener]:
    """Every deciding listener of the plan; `point_trust` empty: mutual TLS is off."""
    found = []
    for point in plan.points:
        trust = point_trust.get(point.name)
        for listener in point.deciding:
            tls = None
            if trust is not None and not listener.from_client:
                tls = identity.credential_files(run_dir / rendering.PKI, pki.spiffe_id("service", listener.sender))
            found.append(Listener(point.name, listener.name, listener.endpoint.reach, listener.endpoint.port, tls,
                                  trust.token_audiences.get(listener.name) if trust else None))
    return found


def token_key(run_dir: Path, plan: Plan) -> dict | None:
    """The entry's label-token key (data.complyroute.token in what its OPA loads from disk); None
    where it issues none."""
    for point in plan.points:
        if any(listener.from_client for listener in point.deciding):
            data_file = run_dir / "points" / point.name / rendering.DISK_DATA / "data.json"
            if data_file.exists():
                return json.loads(data_file.read_text()).get("complyroute", {}).get("token")
    return None


def label_token(key: dict, audience: str, request_id: str) -> str:
    """A token as the entry issues one (policies/complyroute/envoy), for the warm-up record: no
    label claim, so the labels jwt_authn writes are none."""
    now = int(time.time())
    claims = {"iss": key["issuer"], "iat": now, "exp": now + TOKEN_LIFETIME_S, "rid": request_id,
              "digest": "sha256:" + hashlib.sha256(RECORD).hexdigest(), "aud": [audience]}
    return pki.sign_token(claims, {**key["jwk"], "kid": key["kid"]})


@dataclass
class Answer:
    status: int | None  # None: no answer
    body: dict | None
    detail: str

    def decided(self, revision: str) -> bool:
        """OPA's denial of the warm-up record, under `revision` (Envoy's own answers name none)."""
        return self.status == DENIED and isinstance(self.body, dict) and self.body.get("revision") == revision


def ask(listener: Listener, key: dict | None) -> Answer:
    """Send the listener its warm-up record once."""
    request_id = f"warm-up-{uuid.uuid4()}"
    headers = {"content-type": "application/json", "x-request-id": request_id}
    if listener.audience is not None:
        if key is None:
            return Answer(None, None, "no label-token key in the entry's data to send it a token with")
        headers["x-complyroute-labels"] = label_token(key, listener.audience, request_id)
    if listener.tls:
        # As its sender: the sender's credential, the point's certificate checked against the
        # deployment's CA (by chain: a part names itself by a URI SAN only).
        context = ssl.create_default_context(cafile=listener.tls.ca)
        context.check_hostname = False
        context.load_cert_chain(listener.tls.cert, listener.tls.key)
        connection = http.client.HTTPSConnection(listener.host, listener.port, timeout=ASK_TIMEOUT_S, context=context)
    else:
        connection = http.client.HTTPConnection(listener.host, listener.port, timeout=ASK_TIMEOUT_S)
    try:
        connection.request("POST", "/process", body=RECORD, headers=headers)
        answer = connection.getresponse()
        text = answer.read().decode(errors="replace")
    except (OSError, http.client.HTTPException) as error:
        return Answer(None, None, f"no answer: {error}")
    finally:
        connection.close()
    try:
        body = json.loads(text)
    except ValueError:
        body = None
    return Answer(answer.status, body, f"{answer.status} {text[:300]}")


def wait(asked: list[Listener], key: dict | None, revision: str, timeout: float, logs: dict[str, list[str]]) -> dict:
    """Ask each listener its warm-up record until it has decided it under `revision`; what
    state.json keeps of it: {"seconds", "decided": {point/listener: record id}}. Raises
    WarmUpError naming the listeners that did not decide within `timeout`, the first one's last
    answer and `logs[point]`, its point's logs."""
    last: dict[str, Answer] = {}

    def decided(listener: Listener) -> bool:
        last[listener.label] = ask(listener, key)
        return last[listener.label].decided(revision)

    seconds = polling.until({listener.label: functools.partial(decided, listener) for listener in asked}, time.monotonic(), timeout)
    late = [listener for listener in asked if seconds[listener.label] is None]
    if late:
        first = late[0]
        raise WarmUpError(
            f"{len(late)} of {len(asked)} deciding listeners did not decide a warm-up record (expected OPA's denial, "
            f"{DENIED}, under revision {revision}) within {timeout:g} s: {', '.join(listener.label for listener in late[:5])}"
            f"{' ...' if len(late) > 5 else ''}; {first.label} last answered {last[first.label].detail}; "
            f"its logs: {', '.join(logs.get(first.point, []))}")
    return {"seconds": round(max(seconds.values(), default=0.0), 3),
            "decided": {f"{listener.point}/{listener.name}": last[listener.label].body.get("request_id") for listener in asked}}
