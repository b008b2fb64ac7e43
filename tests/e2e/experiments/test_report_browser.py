"""The HTML report in a real browser: Debian's headless Chromium (make browser, which make test
runs) at 1280 x 800, driven over its DevTools protocol. The sample report (experiments/sample/)
must not overflow the page sideways, every image must load, every table-of-contents anchor must
resolve, and the console must stay free of errors; a page with each of those faults is its
denied twin, each fault told apart."""

import base64
import json
import shutil
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
import websocket

from complyroute.topology.manifest import REPO

SAMPLE_PAGE = REPO / "experiments" / "sample" / "report" / "report.html"
WIDTH, HEIGHT = 1280, 800

# Evaluated in the loaded page: what the four checks read.
INSPECT = """JSON.stringify({
  scrollWidth: document.documentElement.scrollWidth,
  clientWidth: document.documentElement.clientWidth,
  images: Array.from(document.images).map(i => ({loaded: i.complete && i.naturalWidth > 0, alt: i.alt})),
  anchors: Array.from(document.querySelectorAll('nav.contents a')).map(a => a.getAttribute('href')),
  unresolved: Array.from(document.querySelectorAll('nav.contents a'))
    .filter(a => !document.getElementById(decodeURIComponent(a.getAttribute('href').slice(1)))).map(a => a.getAttribute('href')),
  captions: Array.from(document.querySelectorAll('figure')).filter(f => !f.querySelector('figcaption')).length,
})"""


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class Chromium:
    """One headless Chromium, one page, spoken to over the DevTools protocol."""

    def __init__(self, profile: Path):
        binary = shutil.which("chromium")
        if binary is None:
            pytest.fail("chromium is not installed: make browser (make test installs it)")
        port = free_port()
        self.process = subprocess.Popen(
            [binary, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--hide-scrollbars",
             f"--remote-debugging-port={port}", "--remote-allow-origins=*", f"--user-data-dir={profile}",
             f"--window-size={WIDTH},{HEIGHT}", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while True:
            try:
                targets = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=2))
                page = next(t for t in targets if t["type"] == "page")
                break
            except (OSError, StopIteration):
                if time.monotonic() > deadline or self.process.poll() is not None:
                    raise RuntimeError("chromium's DevTools endpoint did not come up within 60 s")
                time.sleep(0.2)
        self.socket = websocket.create_connection(page["webSocketDebuggerUrl"], timeout=60)
        self.next_id = 0
        self.events: list[dict] = []

    def call(self, method: str, **params) -> dict:
        self.next_id += 1
        self.socket.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            message = json.loads(self.socket.recv())
            if message.get("id") == self.next_id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message.get("result", {})
            self.events.append(message)

    def wait_for(self, event: str) -> None:
        while not any(e.get("method") == event for e in self.events):
            self.events.append(json.loads(self.socket.recv()))

    def open(self, page: Path) -> dict:
        """Load a page at 1280 x 800; what INSPECT reads of it, and the console's errors."""
        self.events.clear()
        for domain in ("Page", "Runtime", "Log"):
            self.call(f"{domain}.enable")
        self.call("Emulation.setDeviceMetricsOverride", width=WIDTH, height=HEIGHT, deviceScaleFactor=1, mobile=False)
        self.call("Page.navigate", url=page.resolve().as_uri())
        self.wait_for("Page.loadEventFired")
        inspected = json.loads(self.call("Runtime.evaluate", expression=INSPECT, returnByValue=True)["result"]["value"])
        errors = [e["params"] for e in self.events
                  if e.get("method") == "Runtime.exceptionThrown"
                  or (e.get("method") == "Runtime.consoleAPICalled" and e["params"]["type"] == "error")
                  or (e.get("method") == "Log.entryAdded" and e["params"]["entry"]["level"] == "error")]
        return {**inspected, "errors": errors}

    def screenshot(self, path: Path) -> None:
        path.write_bytes(base64.b64decode(self.call("Page.captureScreenshot", format="png")["data"]))

    def close(self) -> None:
        self.socket.close()
        self.process.terminate()
        self.process.wait(timeout=30)


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    chromium = Chromium(tmp_path_factory.mktemp("chromium-profile"))
    yield chromium
    chromium.close()


def test_the_sample_report_fits_1280_by_800_loads_every_image_resolves_its_contents_and_logs_no_error(browser, tmp_path):
    page = browser.open(SAMPLE_PAGE)
    browser.screenshot(tmp_path / "sample.png")  # for a reader of a failure: pytest keeps tmp_path
    assert page["scrollWidth"] <= page["clientWidth"] == WIDTH, "the page overflows sideways"
    assert page["images"] and all(image["loaded"] for image in page["images"])
    assert all(image["alt"] for image in page["images"]) and page["captions"] == 0
    assert len(page["anchors"]) >= 10 and "#findings" in page["anchors"] and page["unresolved"] == []
    assert page["errors"] == []


BROKEN = """<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>broken</title></head><body>
<nav class="contents"><a href="#findings">Findings</a><a href="#nowhere">Nowhere</a></nav>
<h2 id="findings">Findings</h2>
<div style="width: 2000px">a table that does not scroll in a box of its own</div>
<figure><img src="figures/missing.png" alt="a figure never drawn"><figcaption>missing</figcaption></figure>
<script>console.error("a report's script failed")</script>
</body></html>"""


def test_a_page_with_each_fault_fails_each_check(browser, tmp_path):
    broken = tmp_path / "broken.html"
    broken.write_text(BROKEN)
    page = browser.open(broken)
    assert page["scrollWidth"] > page["clientWidth"]
    assert [image["loaded"] for image in page["images"]] == [False]
    assert page["unresolved"] == ["#nowhere"]
    messages = json.dumps(page["errors"])
    assert "a report's script failed" in messages and "missing.png" in messages  # the image's failed load is an error too
