"""The HTML report in a real browser: Debian's headless Chromium (make browser, which make test
runs) at 1280 x 800, driven over its DevTools protocol. The sample report (experiments/sample/)
must not overflow the page sideways, every image must load, every table-of-contents anchor must
resolve, and the console must stay free of errors; a page with each of those faults is its
denied twin, each fault told apart. Opened at an anchor, as a reader following a link would, the
sample shows that section, painted.

A screenshot of a section is taken as here, over DevTools (Page.navigate to the page#anchor, then
Page.captureScreenshot). `chromium --headless --screenshot page.html#anchor` comes out blank for
any anchor below the first screen, even of a page without style or images: it captures the
document from its top while only the tiles around the scrolled-to position are rastered."""

import base64
import io
import json
import shutil
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
import websocket
from PIL import Image

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
  scrollY: window.scrollY,
  anchorTop: location.hash ? document.getElementById(decodeURIComponent(location.hash.slice(1))).getBoundingClientRect().top : null,
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

    def open(self, page: Path, anchor: str = "") -> dict:
        """Load a page at 1280 x 800, at the anchor if one is given; what INSPECT reads of it, and
        the console's errors."""
        for domain in ("Page", "Runtime", "Log"):
            self.call(f"{domain}.enable")
        self.call("Emulation.setDeviceMetricsOverride", width=WIDTH, height=HEIGHT, deviceScaleFactor=1, mobile=False)
        # From a blank page each time: the same page at another anchor would only scroll, and fire no load event.
        for url in ("about:blank", page.resolve().as_uri() + (f"#{anchor}" if anchor else "")):
            self.events.clear()
            self.call("Page.navigate", url=url)
            self.wait_for("Page.loadEventFired")
        inspected = json.loads(self.call("Runtime.evaluate", expression=INSPECT, returnByValue=True)["result"]["value"])
        errors = [e["params"] for e in self.events
                  if e.get("method") == "Runtime.exceptionThrown"
                  or (e.get("method") == "Runtime.consoleAPICalled" and e["params"]["type"] == "error")
                  or (e.get("method") == "Log.entryAdded" and e["params"]["entry"]["level"] == "error")]
        return {**inspected, "errors": errors}

    def screenshot(self, path: Path) -> Image.Image:
        """The viewport as it is painted, saved as a PNG."""
        path.write_bytes(base64.b64decode(self.call("Page.captureScreenshot", format="png")["data"]))
        return Image.open(io.BytesIO(path.read_bytes())).convert("RGB")

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


def blank(image: Image.Image) -> bool:
    """One colour from corner to corner: nothing painted but the background."""
    return all(low == high for low, high in image.getextrema())


@pytest.mark.parametrize("anchor", ["findings", "hop-by-hop"])
def test_the_sample_opened_at_an_anchor_shows_that_section_painted(browser, tmp_path, anchor):
    """#hop-by-hop lies some 12,000 px down the page, below the tallest figures."""
    page = browser.open(SAMPLE_PAGE, anchor)
    shot = browser.screenshot(tmp_path / f"{anchor}.png")
    assert page["scrollY"] > 0 and abs(page["anchorTop"]) <= 1, "the anchor's heading is not at the top of the window"
    assert not blank(shot) and page["errors"] == []


FAR = """<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>far</title></head><body>
<div style="height: 3000px">the first screens</div>
<h2 id="far" style="visibility: hidden">A section never painted</h2><p style="visibility: hidden">its text</p>
<div style="height: 3000px"></div>
</body></html>"""


def test_a_section_that_is_not_painted_is_blank_where_its_anchor_lands(browser, tmp_path):
    far = tmp_path / "far.html"
    far.write_text(FAR)
    page = browser.open(far, "far")
    assert page["scrollY"] > 0 and abs(page["anchorTop"]) <= 1  # it lands there, as the sample's anchors do
    assert blank(browser.screenshot(tmp_path / "far.png"))
    top = browser.open(far)
    assert top["scrollY"] == 0 and not blank(browser.screenshot(tmp_path / "top.png"))  # its first screen is painted


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
