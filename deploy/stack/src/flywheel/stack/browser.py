"""An HTML page seen by a real browser: headless Chromium (Debian's package, installed by
scripts/setup.sh) driven over the DevTools protocol with aiohttp's websocket.

``render_in_chromium`` opens a page and says what a person would see: its text, whether every
image decoded, what the console complained about, and a full-page screenshot with a measure of
how blank it is. ``check_report_in_browser`` adds the verdict the report tests assert on."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

import aiohttp

# Page height captured at most (a runaway page would make a huge PNG).
MAX_SHOT_HEIGHT = 16_000
# A report's screenshot with less ink than this is blank (a white page with a line of text is
# about 0.2 %; the demo report with its plots is well above 5 %).
MIN_INK = 0.02


class BrowserError(RuntimeError):
    """Chromium is missing, did not start, or the DevTools protocol answered an error."""


async def render_in_chromium(page: Path, screenshot: Path, timeout_s: float = 60) -> dict[str, Any]:
    """Open ``page`` in headless Chromium and return what it showed:

    ``text`` (the body's innerText), ``images`` (each <img>'s natural width; 0 = not decoded),
    ``plots`` / ``empty_plots`` (``img.plot`` / ``.plot-empty`` elements, the demo report's
    figures), ``errors`` (console errors, failed loads and uncaught exceptions), ``screenshot``
    (the full-page PNG written to ``screenshot``), ``size`` ([width, height] of it), ``ink``
    (its fraction of non-white pixels) and ``colours`` (its number of distinct colours)."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if not chromium:
        raise BrowserError("Debian's chromium is missing: run scripts/setup.sh (it installs it as root)")
    # A throwaway profile: nothing is left beside the page (the demo writes its report in the repo)
    with tempfile.TemporaryDirectory(prefix="flywheel-chromium-") as profile:
        proc = await asyncio.create_subprocess_exec(
            chromium,
            "--headless=new",
            "--no-sandbox",  # root in CI
            "--disable-gpu",
            "--no-first-run",
            "--hide-scrollbars",
            f"--user-data-dir={profile}",
            "--remote-debugging-port=0",
            "--window-size=1280,1600",
            "about:blank",
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
        )
        drain = None
        try:
            async with asyncio.timeout(timeout_s):
                assert proc.stderr is not None
                port = None
                while port is None:
                    line = (await proc.stderr.readline()).decode(errors="replace")
                    if not line:
                        raise BrowserError(f"chromium exited (code {await proc.wait()}) before it listened")
                    found = re.search(r"DevTools listening on ws://127\.0\.0\.1:(\d+)/", line)
                    port = found and found.group(1)
                # Keep reading its log: a full stderr pipe would stall the browser
                drain = asyncio.create_task(_drain(proc.stderr))
                async with aiohttp.ClientSession() as http:
                    async with http.get(f"http://127.0.0.1:{port}/json/list") as resp:
                        targets = await resp.json()
                    ws_url = next(t["webSocketDebuggerUrl"] for t in targets if t["type"] == "page")
                    async with http.ws_connect(ws_url, max_msg_size=0) as ws:
                        seen = await _inspect(ws, page, screenshot)
        finally:
            if proc.returncode is None:
                proc.kill()
            await proc.wait()
            if drain:
                drain.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await drain
    seen.update(await asyncio.to_thread(_ink, screenshot))
    return seen


async def check_report_in_browser(html: Path, tmp: Path) -> dict[str, Any]:
    """Open a demo report (``flywheel.stack.story.report``) in Chromium: what
    :func:`render_in_chromium` returns (screenshot at ``tmp/report.png``) plus ``problems``, a
    list of what a person would find wrong (empty when the page is fine): console errors, an
    image that did not decode, no plot at all, a blank screenshot."""
    await asyncio.to_thread(tmp.mkdir, parents=True, exist_ok=True)
    seen = await render_in_chromium(html, tmp / "report.png")
    problems = [f"console: {e}" for e in seen["errors"]]
    broken = [i for i, w in enumerate(seen["images"]) if w <= 0]
    if broken:
        problems.append(f"images not decoded: {broken} of {len(seen['images'])}")
    if not seen["plots"]:
        problems.append("no plot on the page")
    if seen["ink"] < MIN_INK:
        problems.append(f"the screenshot is blank: {seen['ink']:.2%} non-white pixels (at least {MIN_INK:.0%})")
    seen["problems"] = problems
    return seen


async def _drain(stream: asyncio.StreamReader) -> None:
    while await stream.read(65536):
        pass


def _ink(screenshot: Path) -> dict[str, Any]:
    """How much of the screenshot is not white, and how many colours it has."""
    from PIL import Image

    with Image.open(screenshot) as im:
        rgb = im.convert("RGB")
        grey = rgb.convert("L")
        histogram = grey.histogram()
        pixels = rgb.width * rgb.height
        ink = 1 - sum(histogram[245:]) / pixels if pixels else 0.0  # near-white counts as white
        colours = rgb.getcolors(maxcolors=1 << 24)
        return {"size": [rgb.width, rgb.height], "ink": ink, "colours": len(colours or [])}


async def _inspect(ws: aiohttp.ClientWebSocketResponse, page: Path, screenshot: Path) -> dict[str, Any]:
    errors: list[str] = []
    replies: dict[int, asyncio.Future[dict[str, Any]]] = {}
    loaded = asyncio.Event()
    next_id = 0

    async def reader() -> None:
        async for msg in ws:
            data = json.loads(msg.data)
            method = data.get("method", "")
            if "id" in data:
                replies.pop(data["id"]).set_result(data)
            elif method == "Runtime.exceptionThrown":
                errors.append(str(data["params"]["exceptionDetails"].get("text")))
            elif method == "Runtime.consoleAPICalled" and data["params"]["type"] in ("error", "assert"):
                errors.append(json.dumps(data["params"]["args"]))
            elif method == "Log.entryAdded" and data["params"]["entry"]["level"] == "error":
                errors.append(data["params"]["entry"]["text"])
            elif method == "Page.loadEventFired":
                loaded.set()

    async def call(method: str, **params: Any) -> dict[str, Any]:
        nonlocal next_id
        next_id += 1
        replies[next_id] = asyncio.get_running_loop().create_future()
        waiting = replies[next_id]
        await ws.send_json({"id": next_id, "method": method, "params": params})
        reply = await waiting
        if "error" in reply:
            raise BrowserError(f"{method}: {reply['error']}")
        return reply["result"]

    task = asyncio.create_task(reader())
    try:
        for domain in ("Page", "Runtime", "Log"):
            await call(f"{domain}.enable")
        await call("Page.navigate", url=(await asyncio.to_thread(page.resolve)).as_uri())
        await loaded.wait()
        probe = (
            "JSON.stringify({text: document.body.innerText,"
            " images: [...document.images].map(i => i.naturalWidth),"
            " plots: document.querySelectorAll('img.plot').length,"
            " empty_plots: document.querySelectorAll('.plot-empty').length})"
        )
        found = json.loads((await call("Runtime.evaluate", expression=probe, returnByValue=True))["result"]["value"])
        # The whole page, not just the window: clip to the content's size
        metrics = await call("Page.getLayoutMetrics")
        content = metrics.get("cssContentSize") or metrics["contentSize"]
        clip = {
            "x": 0,
            "y": 0,
            "width": max(1, int(content["width"])),
            "height": max(1, min(int(content["height"]), MAX_SHOT_HEIGHT)),
            "scale": 1,
        }
        shot = await call("Page.captureScreenshot", format="png", captureBeyondViewport=True, clip=clip)
        await asyncio.to_thread(screenshot.write_bytes, base64.b64decode(shot["data"]))
        await asyncio.sleep(0.2)  # console messages logged during load arrive before this
        return {**found, "errors": errors, "screenshot": str(screenshot)}
    finally:
        task.cancel()
