"""Headless Chromium driven over the DevTools protocol, stdlib only.

`--remote-debugging-pipe` makes Chromium read commands on fd 3 and answer on
fd 4 (JSON messages ended by a NUL byte), so no port is opened and nothing
but this process can talk to it. Network access is cut with a proxy that
does not exist: a page that tries to fetch anything off the machine fails,
and every request the page made is listed in `requests`.

Used by the report tests and, as a script, to take the docs' screenshots:
    python -m tests.report.browser PAGE.html OUT.png [--selector CSS | --until CSS] [--scale S] [--width W]
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "chrome")


def find_chromium() -> str | None:
    return next((p for p in map(shutil.which, CANDIDATES) if p), None)


class BrowserError(RuntimeError):
    pass


class Browser:
    """One headless Chromium; `open(url)` loads a page in a fresh tab and returns a Page."""

    def __init__(self, binary: str | None = None, timeout: float = 60.0):
        self.binary = binary or find_chromium()
        if self.binary is None:
            raise BrowserError("no chromium on PATH")
        self.timeout = timeout
        self.profile = tempfile.mkdtemp(prefix="hctool-chromium-")
        to_child_r, self._to_child = os.pipe()
        self._from_child, from_child_w = os.pipe()

        def wire_fds():  # runs in the child before exec: the protocol's fds are 3 and 4
            r, w = os.dup(to_child_r), os.dup(from_child_w)  # above 4, so neither dup2 below clobbers the other
            os.dup2(r, 3)
            os.dup2(w, 4)

        args = [
            self.binary,
            "--headless=new",
            "--remote-debugging-pipe",
            f"--user-data-dir={self.profile}",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--no-default-browser-check",
            "--disable-extensions",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--metrics-recording-only",
            "--mute-audio",
            "--hide-scrollbars",
            "--proxy-server=http://127.0.0.1:9",
            "--proxy-bypass-list=<-loopback>",
            "about:blank",
        ]
        self.proc = subprocess.Popen(
            args,
            preexec_fn=wire_fds,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            close_fds=False,
        )
        os.close(to_child_r)
        os.close(from_child_w)
        self._buf = b""
        self._next_id = 0
        self.events: list[dict] = []

    # -- protocol -------------------------------------------------------------------------
    def send(self, method: str, params: dict | None = None, session: str | None = None) -> dict:
        self._next_id += 1
        msg = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self._to_child, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + self.timeout
        while True:
            reply = self._read(deadline)
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise BrowserError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)

    def wait_event(self, method: str, session: str | None, timeout: float | None = None) -> dict:
        deadline = time.monotonic() + (timeout or self.timeout)
        for i, ev in enumerate(self.events):
            if ev.get("method") == method and ev.get("sessionId") == session:
                return self.events.pop(i)
        while True:
            ev = self._read(deadline)
            if ev.get("method") == method and ev.get("sessionId") == session:
                return ev
            self.events.append(ev)

    def _read(self, deadline: float) -> dict:
        import select

        while b"\0" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise BrowserError("chromium did not answer in time")
            ready, _, _ = select.select([self._from_child], [], [], left)
            if not ready:
                continue
            chunk = os.read(self._from_child, 1 << 16)
            if not chunk:
                err = self.proc.stderr.read().decode(errors="replace")[-2000:] if self.proc.poll() is not None else ""
                raise BrowserError(f"chromium closed the pipe {err}")
            self._buf += chunk
        raw, self._buf = self._buf.split(b"\0", 1)
        return json.loads(raw)

    # -- pages ----------------------------------------------------------------------------
    def open(self, url: str, width: int = 1400, height: int = 900) -> Page:
        target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        page = Page(self, session)
        for domain in ("Page", "Runtime", "Log", "Network"):
            self.send(f"{domain}.enable", session=session)
        self.send(
            "Emulation.setDeviceMetricsOverride",
            {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
            session,
        )
        self.send("Page.navigate", {"url": url}, session)
        self.wait_event("Page.loadEventFired", session)
        return page

    def close(self) -> None:
        try:
            if self.proc.poll() is None:
                try:
                    self.send("Browser.close")
                except (BrowserError, OSError):
                    pass
                try:
                    self.proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait(timeout=10)
        finally:
            for fd in (self._to_child, self._from_child):
                try:
                    os.close(fd)
                except OSError:
                    pass
            if self.proc.stderr:
                self.proc.stderr.close()
            shutil.rmtree(self.profile, ignore_errors=True)

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class Page:
    def __init__(self, browser: Browser, session: str):
        self.b, self.session = browser, session

    def eval(self, expression: str):
        res = self.b.send(
            "Runtime.evaluate", {"expression": expression, "returnByValue": True, "awaitPromise": True}, self.session
        )
        if "exceptionDetails" in res:
            raise BrowserError(f"{expression[:60]}: {res['exceptionDetails'].get('text')}")
        return res["result"].get("value")

    def dom(self) -> str:
        return self.eval("document.documentElement.outerHTML")

    def _box(self, selector: str) -> list[float]:
        return self.eval(
            f"(() => {{ const r = document.querySelector({json.dumps(selector)})"
            f".getBoundingClientRect(); return [r.left + scrollX, r.top + scrollY, r.width, r.height]; }})()"
        )

    def screenshot(self, path: Path, selector: str | None = None, until: str | None = None, scale: float = 1.0) -> Path:
        """The element `selector`, or the page from its top to the bottom of `until`, or all of it."""
        params: dict = {"format": "png", "captureBeyondViewport": True}
        w, h = self.eval("[document.documentElement.scrollWidth, document.documentElement.scrollHeight]")
        if selector:
            x, y, w, h = self._box(selector)
        else:
            x = y = 0
            if until:
                box = self._box(until)
                h = box[1] + box[3] + 12
        params["clip"] = {"x": x, "y": y, "width": w, "height": h, "scale": scale}
        data = self.b.send("Page.captureScreenshot", params, self.session)["data"]
        Path(path).write_bytes(base64.b64decode(data))
        return Path(path)

    def _mine(self, method: str) -> list[dict]:
        return [e["params"] for e in self.b.events if e.get("method") == method and e.get("sessionId") == self.session]

    def console_errors(self) -> list[str]:
        """Uncaught exceptions, console.error calls and error log entries seen so far."""
        self.eval("0")  # drain what the page emitted up to now
        out = [
            e["exceptionDetails"].get("text", "")
            + " "
            + str(e["exceptionDetails"].get("exception", {}).get("description", ""))
            for e in self._mine("Runtime.exceptionThrown")
        ]
        out += [
            " ".join(str(a.get("value", a.get("description", ""))) for a in e.get("args", []))
            for e in self._mine("Runtime.consoleAPICalled")
            if e.get("type") in ("error", "assert")
        ]
        out += [e["entry"].get("text", "") for e in self._mine("Log.entryAdded") if e["entry"].get("level") == "error"]
        return out

    def requests(self) -> list[str]:
        return [e["request"]["url"] for e in self._mine("Network.requestWillBeSent")]


def main(argv: list[str]) -> int:
    import argparse

    ap = argparse.ArgumentParser(description="Screenshot an HTML file with headless Chromium.")
    ap.add_argument("page", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--selector", help="only this element")
    ap.add_argument("--until", help="from the top of the page to the bottom of this element")
    ap.add_argument("--scale", type=float, default=1.0)
    ap.add_argument("--width", type=int, default=1400)
    ap.add_argument("--height", type=int, default=900)
    a = ap.parse_args(argv)
    with Browser() as b:
        page = b.open(a.page.resolve().as_uri(), a.width, a.height)
        page.screenshot(a.out, a.selector, a.until, a.scale)
        errors = page.console_errors()
    for e in errors:
        print(f"console: {e}", file=sys.stderr)
    print(a.out)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
