"""A minimal client for a deployment's entry: send one labelled record, get status and JSON back."""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from complyroute.policy import labels as label_schema
from complyroute.policy.policyfiles import POLICIES


@dataclass
class Answer:
    status: int
    body: dict | None
    text: str
    request_id: str | None = None  # the record's id (x-request-id of the answer): the entry assigns it

    def summary(self) -> str:
        if self.status == 200 and self.body:
            hops = " -> ".join(f"{h['instance']} ({h['region']}, {h['node']})" for h in self.body["path"])
            return f"200 delivered: {hops}"
        if self.body and "code" in self.body:
            return f"{self.status} {self.body['code']}: {self.body.get('message', '')}"
        return f"{self.status} {self.text[:200]}"


def send(url: str, labels: dict[str, str], record: dict | str, request_id: str | None = None, headers: dict | None = None,
         timeout: float = 30, context: ssl.SSLContext | None = None, policies: Path = POLICIES) -> Answer:
    """POST a record with its labels (by name) in the headers the rule set's label schema names
    (`policies`, the shipped rule set's by default: region -> x-data-region, ...).

    `context`: TLS as a part of the deployment (its certificate), for an https URL.
    """
    data = record if isinstance(record, str) else json.dumps(record)
    header_of = {label.name: label.header for label in label_schema.schema(policies)}
    unknown = sorted(set(labels) - set(header_of))
    if unknown:
        raise ValueError(f"labels {', '.join(unknown)} are not in the label schema of {policies} ({', '.join(sorted(header_of))})")
    request_headers = {"content-type": "application/json", **{header_of[name]: value for name, value in labels.items()}}
    if request_id:
        request_headers["x-request-id"] = request_id
    request_headers.update(headers or {})
    request = urllib.request.Request(url, data=data.encode(), headers=request_headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=timeout, context=context) as response:
            status, text, assigned = response.status, response.read().decode(), response.headers.get("x-request-id")
    except urllib.error.HTTPError as error:
        status, text, assigned = error.code, error.read().decode(), error.headers.get("x-request-id")
    try:
        body = json.loads(text)
    except json.JSONDecodeError:
        body = None
    return Answer(status, body if isinstance(body, dict) else None, text, assigned)
