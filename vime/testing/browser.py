"""A headless Chromium driven over the DevTools protocol on a pipe: open a page, run JavaScript, click, screenshot.

For the report tests and for looking at a page by hand (``python -m vime.testing.browser page.html
shot.png``). ``--remote-debugging-pipe`` speaks NUL-separated JSON on file descriptors 3 and 4, so
no websocket library and no port are needed. Every wait is for a protocol message (with a deadline),
never a sleep. Console errors, uncaught exceptions and every network request the page makes are kept.
"""

from __future__ import annotations

import base64
import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def find_chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


class BrowserError(RuntimeError):
    """The browser died, timed out, or answered a command with an error."""


class Browser:
    """One headless Chromium with one page. Use as a context manager.

    ``open(url)`` loads a page and waits for its load event; ``eval(js)`` returns the value of an
    expression (promises awaited); ``mouse(kind, x, y)`` sends a mouse event; ``screenshot(path)``
    writes a PNG of the whole page. ``console_errors``, ``exceptions`` and ``requests`` collect what
    the page did since it was opened.
    """

    def __init__(self, *, width: int = 1280, height: int = 900, timeout_s: float = 60.0,
                 executable: str | None = None) -> None:
        exe = executable or find_chromium()
        if exe is None:
            raise BrowserError("no chromium found (apt-get install chromium)")
        self.timeout_s = timeout_s
        self.width, self.height = width, height
        self._profile = tempfile.mkdtemp(prefix="vime-chromium-")
        to_child_r, self._to_child = os.pipe()
        self._from_child, from_child_w = os.pipe()

        def fds() -> None:  # runs in the child: the pipe ends become fds 3 (commands in) and 4 (answers out)
            a, b = os.dup(to_child_r), os.dup(from_child_w)
            os.dup2(a, 3)
            os.dup2(b, 4)
            os.set_inheritable(3, True)
            os.set_inheritable(4, True)

        self._proc = subprocess.Popen(
            [exe, "--headless", "--no-sandbox", "--disable-gpu", "--remote-debugging-pipe", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             "--disable-extensions", "--disable-default-apps", "--mute-audio", "--hide-scrollbars",
             f"--user-data-dir={self._profile}", f"--window-size={width},{height}", "about:blank"],
            preexec_fn=fds, close_fds=False, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL)
        os.close(to_child_r)
        os.close(from_child_w)
        self._buf = b""
        self._id = 0
        self._events: list[dict[str, Any]] = []
        self.session: str | None = None
        self.console_errors: list[str] = []
        self.exceptions: list[str] = []
        self.requests: list[str] = []
        try:
            target = self.call("Target.createTarget", {"url": "about:blank"})["targetId"]
            self.session = self.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
            for domain in ("Page", "Runtime", "Log", "Network"):
                self.call(f"{domain}.enable")
            self.call("Emulation.setDeviceMetricsOverride", {"width": width, "height": height, "deviceScaleFactor": 1,
                                                             "mobile": False})
        except BaseException:
            self.close()
            raise

    # --- the protocol ---------------------------------------------------------------------------
    def _read(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise BrowserError("chromium did not answer in time")
            ready, _, _ = select.select([self._from_child], [], [], left)
            if not ready:
                continue
            chunk = os.read(self._from_child, 1 << 20)
            if not chunk:
                raise BrowserError("chromium closed the pipe (it exited)")
            self._buf += chunk
        raw, _, self._buf = self._buf.partition(b"\0")
        msg: dict[str, Any] = json.loads(raw)
        return msg

    def _note(self, msg: dict[str, Any]) -> None:
        method, p = msg.get("method"), msg.get("params", {})
        if method == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
            self.console_errors.append(" ".join(str(a.get("value", a.get("description", ""))) for a in p.get("args", [])))
        elif method == "Runtime.exceptionThrown":
            d = p.get("exceptionDetails", {})
            self.exceptions.append(str(d.get("exception", {}).get("description") or d.get("text")))
        elif method == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
            self.console_errors.append(str(p["entry"].get("text")))
        elif method == "Network.requestWillBeSent":
            self.requests.append(str(p.get("request", {}).get("url")))
        self._events.append(msg)

    def call(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        """Send one command (to the page once attached) and return its result."""
        self._id += 1
        msg: dict[str, Any] = {"id": self._id, "method": method, "params": params or {}}
        if self.session is not None:
            msg["sessionId"] = self.session
        os.write(self._to_child, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + self.timeout_s
        while True:
            answer = self._read(deadline)
            if answer.get("id") == self._id:
                if "error" in answer:
                    raise BrowserError(f"{method}: {answer['error']}")
                result: dict[str, Any] = answer.get("result", {})
                return result
            self._note(answer)

    def wait_event(self, method: str) -> dict[str, Any]:
        """The next event `method` (one that already arrived counts)."""
        for i, ev in enumerate(self._events):
            if ev.get("method") == method:
                del self._events[i]
                return ev
        deadline = time.monotonic() + self.timeout_s
        while True:
            msg = self._read(deadline)
            if msg.get("method") == method:
                self._note(msg)
                self._events.remove(msg)
                return msg
            self._note(msg)

    # --- what tests use -------------------------------------------------------------------------
    def open(self, url: str) -> None:
        """Load `url` and wait for its load event; the collected errors and requests start afresh."""
        self._events.clear()
        self.console_errors, self.exceptions, self.requests = [], [], []
        self.call("Page.navigate", {"url": url})
        self.wait_event("Page.loadEventFired")

    def eval(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (JSON-able; promises are awaited)."""
        r = self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True, "awaitPromise": True})
        if "exceptionDetails" in r:
            d = r["exceptionDetails"]
            raise BrowserError(f"{expression[:80]}: {d.get('exception', {}).get('description') or d.get('text')}")
        return r.get("result", {}).get("value")

    def mouse(self, kind: str, x: float, y: float, *, button: str = "left", clicks: int = 1) -> None:
        """A mouse event at viewport point (x, y): kind is mouseMoved, mousePressed or mouseReleased."""
        self.call("Input.dispatchMouseEvent", {"type": kind, "x": x, "y": y, "button": button if kind != "mouseMoved" else "none",
                                               "buttons": 1 if kind == "mousePressed" else 0, "clickCount": clicks})

    def drag(self, x0: float, y0: float, x1: float, y1: float, steps: int = 6) -> None:
        self.mouse("mouseMoved", x0, y0)
        self.mouse("mousePressed", x0, y0)
        for i in range(1, steps + 1):
            self.call("Input.dispatchMouseEvent", {"type": "mouseMoved", "x": x0 + (x1 - x0) * i / steps,
                                                   "y": y0 + (y1 - y0) * i / steps, "button": "left", "buttons": 1})
        self.mouse("mouseReleased", x1, y1)

    def screenshot(self, path: str | Path | None = None, *, full_page: bool = True) -> bytes:
        """A PNG of the page (the whole page, not only the window, unless `full_page` is False)."""
        params: dict[str, Any] = {"format": "png"}
        if full_page:
            size = self.call("Page.getLayoutMetrics")["cssContentSize"]
            params.update(captureBeyondViewport=True, clip={"x": 0, "y": 0, "width": self.width,
                                                            "height": min(int(size["height"]), 16000), "scale": 1})
        png = base64.b64decode(self.call("Page.captureScreenshot", params)["data"])
        if path is not None:
            Path(path).write_bytes(png)
        return png

    def close(self) -> None:
        if self._proc.poll() is None:
            try:
                self.call("Browser.close") if self.session is None else None
            except BrowserError:
                pass
            self._proc.terminate()
            try:
                self._proc.wait(10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        for fd in (self._to_child, self._from_child):
            try:
                os.close(fd)
            except OSError:
                pass
        shutil.rmtree(self._profile, ignore_errors=True)

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def main(argv: list[str] | None = None) -> int:
    """``python -m vime.testing.browser PAGE.html SHOT.png [WIDTH]``: screenshot a page, print its errors."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) < 2:
        print(main.__doc__, file=sys.stderr)
        return 2
    width = int(args[2]) if len(args) > 2 else 1280
    with Browser(width=width) as b:
        b.open(Path(args[0]).resolve().as_uri())
        b.screenshot(args[1])
        info = b.eval("JSON.stringify({rendered: document.body.dataset.rendered, ms: document.body.dataset.renderMs,"
                      " error: document.body.dataset.jsError || null, h: document.documentElement.scrollHeight})")
        print(info)
        for e in b.console_errors + b.exceptions:
            print("error:", e)
        others = [u for u in b.requests if not u.startswith(("file:", "data:", "about:"))]
        for u in others:
            print("network:", u)
        return 1 if (b.console_errors or b.exceptions or others) else 0


if __name__ == "__main__":
    sys.exit(main())
