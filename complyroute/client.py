"""A minimal client for a deployment's entry: send one labelled record, get status and JSON back."""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request
from dataclasses import dataclass


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
         timeout: float = 30, context: ssl.SSLContext | None = None) -> Answer:
    """POST a record with its labels as headers (region, category, consent -> x-data-*).

    `context`: TLS as a part of the deployment (its certificate), for an https URL.
    """
    data = record if isinstance(record, str) else json.dumps(record)
    request_headers = {"content-type": "application/json", **{f"x-data-{k}": v for k, v in labels.items()}}
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
