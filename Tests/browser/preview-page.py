#!/usr/bin/env python3
"""preview-server's live web page in a real browser: Debian's headless Chromium driven by PyPI's
Selenium (Tests/harness/install-browser.sh installs them).

    preview-page.py check --url http://HOST:PORT/ --push 'preview-push --host HOST --port P'
                          --work DIR --inbox DIR [--screenshots DIR]
    preview-page.py scripted --url ... --push ... --work DIR --inbox DIR   (a server with --allow-scripts)
    preview-page.py bench --url ... --push ... --work DIR --inbox DIR [--pushes 100] [--files 1000]
                          [--server-pid PID]

`check` pushes files with the real preview-push and looks at what the page shows; it prints one
line per check, `CHECK <name> pass <detail>` or `CHECK <name> FAIL <detail>`, and `MEASURED`
lines. `bench` is D2 (Benchmarks/preview-page.sh): push completed -> visible in the page, over
100 pushes of a 100 kB image, and the daemon's RSS with the page open and 1,000 files listed.
Every wait is bounded; the browser is always quit.
"""
import argparse
import http.client
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import time
import urllib.parse
import zlib
import struct

from PIL import Image
from prometheus_client.parser import text_string_to_metric_families
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

RED = (220, 30, 30)
BLUE = (30, 60, 220)


def encode_png(width, height, rows, level=6):
    """An 8-bit RGB PNG of `rows` (each width*3 bytes), written here so that the test depends on
    no image tool."""
    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    raw = b"".join(b"\x00" + row for row in rows)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(raw, level)) + chunk(b"IEND", b""))


def png(width, height, rgb):
    """A solid-colour PNG."""
    return encode_png(width, height, [bytes(rgb) * width] * height)


def noisy_png(width, height, seed):
    """A PNG of about width*height*3 bytes that does not compress (for the 100 kB pushes)."""
    import random
    rng = random.Random(seed)
    return encode_png(width, height, [rng.randbytes(width * 3) for _ in range(height)], level=0)


def browser(width, height):
    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium") or "/usr/bin/chromium"
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                     "--hide-scrollbars", "--force-device-scale-factor=1", f"--window-size={width},{height}",
                     "--no-first-run", "--disable-extensions", "--disable-background-networking"):
        options.add_argument(argument)
    service = Service(executable_path=shutil.which("chromedriver") or "/usr/bin/chromedriver")
    driver = webdriver.Chrome(options=options, service=service)
    driver.set_page_load_timeout(20)
    driver.set_script_timeout(20)
    return driver


class Pusher:
    def __init__(self, command):
        self.command = shlex.split(command)

    def push(self, path):
        """Pushes `path`; returns the wall-clock time (ms) preview-push said the file was stored
        (it prints that line when the server's preview.result arrives)."""
        process = subprocess.Popen(self.command + [path], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        stored_at = None
        output = []
        deadline = time.time() + 60
        for line in process.stdout:
            output.append(line)
            if stored_at is None and line.startswith("stored "):
                stored_at = time.time() * 1000
            if time.time() > deadline:
                process.kill()
                break
        status = process.wait(timeout=30)
        if status != 0 or stored_at is None:
            raise RuntimeError(f"preview-push {path} failed ({status}): {''.join(output)}")
        return stored_at


def wait(driver, what, condition, timeout=15):
    return WebDriverWait(driver, timeout, poll_frequency=0.01).until(lambda d: condition(d), message=what)


def live(driver, what="the page's event stream open"):
    """Waits until the page's status says its event stream is open."""
    return wait(driver, what, lambda d: d.execute_script(
        "return document.getElementById('status').dataset.state === 'live'"))


def shown(driver, name):
    """The #document element once it shows `name`."""
    return wait(driver, f"{name} shown", lambda d: d.execute_script(
        "const e = document.getElementById('document'); return e && e.dataset.name === arguments[0] ? e : null;",
        name))


def raw_get(url, path, headers=None):
    """GET `path` exactly as written (no normalisation of `..`): status, headers, body."""
    parsed = urllib.parse.urlsplit(url)
    connection = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=10)
    # The page's link may carry its token as a path prefix (/t/TOKEN/): every request goes under it.
    connection.putrequest("GET", parsed.path.rstrip("/") + path, skip_accept_encoding=True)
    for name, value in (headers or {}).items():
        connection.putheader(name, value)
    connection.endheaders()
    response = connection.getresponse()
    body = response.read()
    connection.close()
    return response.status, {k.lower(): v for k, v in response.getheaders()}, body


class Checks:
    def __init__(self):
        self.failed = 0

    def report(self, name, ok, detail=""):
        print(f"CHECK {name} {'pass' if ok else 'FAIL'} {detail}".rstrip(), flush=True)
        if not ok:
            self.failed += 1

    def run(self, name, body):
        try:
            ok, detail = body()
        except Exception as error:  # a check that could not run is a failed check, with why
            ok, detail = False, f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
        self.report(name, ok, detail)


def colour_at(screenshot, x, y):
    return screenshot.getpixel((int(x), int(y)))[:3]


def near(a, b, tolerance=12):
    return all(abs(p - q) <= tolerance for p, q in zip(a, b))


def check(arguments):
    work, inbox = arguments.work, arguments.inbox
    shots = arguments.screenshots or work
    pusher = Pusher(arguments.push)
    with open(f"{work}/red.png", "wb") as f:
        f.write(png(200, 150, RED))
    with open(f"{work}/blue.png", "wb") as f:
        f.write(png(120, 90, BLUE))
    with open(f"{work}/notes.md", "w") as f:
        f.write("# Heading One\n\nSome *emphasis*, a list:\n\n- one\n- two\n\n"
                "<script>document.body.dataset.ran = 'yes'</script>\n")
    with open(f"{work}/page.html", "w") as f:
        f.write("<!doctype html><p id=m>not run</p>"
                "<script>document.getElementById('m').textContent = 'ran';"
                "try { parent.document.title = 'pwned' } catch (e) {}</script>")
    checks = Checks()
    driver = browser(1280, 900)
    try:
        driver.get(arguments.url)
        checks.run("page-live", lambda: (live(driver) and True, "the status says live"))

        def png_shown():
            pusher.push(f"{work}/red.png")
            image = shown(driver, "red.png")
            wait(driver, "red.png loaded", lambda d: d.execute_script(
                "return arguments[0].complete && arguments[0].naturalWidth === 200", image))
            rect = driver.execute_script("const r = arguments[0].getBoundingClientRect();"
                                         "return [r.left, r.top, r.width, r.height];", image)
            driver.save_screenshot(f"{shots}/desktop.png")
            screenshot = Image.open(f"{shots}/desktop.png").convert("RGB")
            centre = colour_at(screenshot, rect[0] + rect[2] / 2, rect[1] + rect[3] / 2)
            corner = colour_at(screenshot, rect[0] + 5, rect[1] + 5)
            outside = colour_at(screenshot, 5, 5)  # the header
            ok = near(centre, RED) and near(corner, RED) and not near(outside, RED)
            return ok, (f"screenshot pixels at the image's centre {centre} and corner {corner}, expected {RED}; "
                        f"outside it {outside}; image at {[round(v) for v in rect]}")
        checks.run("png-shown", png_shown)

        def markdown_heading():
            pusher.push(f"{work}/notes.md")
            frame = shown(driver, "notes.md")
            wait(driver, "notes.md rendered", lambda d: d.execute_script(
                "return arguments[0].dataset.name === 'notes.md'", frame))
            driver.switch_to.frame(frame)
            try:
                heading = wait(driver, "a heading in notes.md", lambda d: d.find_elements(By.CSS_SELECTOR, "h1"))[0]
                items = len(driver.find_elements(By.CSS_SELECTOR, "li"))
                ran = driver.execute_script("return document.body.dataset.ran || 'no'")
                size = driver.execute_script("return getComputedStyle(arguments[0]).fontSize", heading)
                text = heading.text
            finally:
                driver.switch_to.default_content()
            ok = text == "Heading One" and items == 2 and ran == "no"
            return ok, f"<h1> says {text!r} at {size}, {items} list items, its script ran: {ran}"
        checks.run("markdown-heading", markdown_heading)

        def live_update():
            driver.execute_script("window.__samePage = 'yes'")
            stored_at = pusher.push(f"{work}/blue.png")
            wait(driver, "blue.png's event", lambda d: d.execute_script("return window.previewArrivals['blue.png']"))
            arrived = driver.execute_script("return window.previewArrivals['blue.png']")
            image = shown(driver, "blue.png")
            wait(driver, "blue.png loaded", lambda d: d.execute_script(
                "return arguments[0].complete && arguments[0].naturalWidth === 120", image))
            visible = driver.execute_script("return window.previewVisible['blue.png']")
            same = driver.execute_script("return window.__samePage")
            latency = arrived - stored_at
            print(f"MEASURED page: push result -> event in the page {latency:.0f} ms, -> image loaded "
                  f"{visible - stored_at:.0f} ms", flush=True)
            return same == "yes" and latency <= 200, (
                f"the event came {latency:.0f} ms after preview-push printed the result (bound 200 ms); "
                f"image loaded after {visible - stored_at:.0f} ms; no reload: {same == 'yes'}")
        checks.run("live-update", live_update)

        def html_sandboxed():
            title = driver.title
            pusher.push(f"{work}/page.html")
            frame = shown(driver, "page.html")
            sandbox = frame.get_attribute("sandbox")
            driver.switch_to.frame(frame)
            try:
                marker = wait(driver, "page.html's marker", lambda d: d.find_elements(By.ID, "m"))[0].text
            finally:
                driver.switch_to.default_content()
            ok = marker == "not run" and driver.title == title and sandbox == ""
            return ok, f"the DOM marker says {marker!r}, the page's title {driver.title!r}, sandbox={sandbox!r}"
        checks.run("html-sandboxed", html_sandboxed)

        def click_shows():
            # An earlier file clicked in the list is shown large (the newest stays first in the list).
            driver.execute_script(
                "[...document.querySelectorAll('#files li')].find(e => e.dataset.name === 'red.png').querySelector('button').click()")
            image = shown(driver, "red.png")
            first = driver.execute_script("return document.querySelector('#files li').dataset.name")
            current = driver.execute_script(
                "return [...document.querySelectorAll('#files li')].filter(e => e.getAttribute('aria-current') === 'true')"
                ".map(e => e.dataset.name)")
            return image.tag_name == "img" and first == "page.html" and current == ["red.png"], (
                f"shown: {image.tag_name} red.png; first in the list {first}; marked current {current}")
        checks.run("click-shows", click_shows)

        def bidi_escaped():
            # Pushed names may not contain bidirectional controls (the server refuses them); a file
            # copied into the folder by hand may: the page shows the escape, never the control.
            name = "invoice\u202egnp.exe"
            with open(f"{inbox}/{name}", "wb") as f:
                f.write(b"MZ")
            driver.refresh()
            wait(driver, "the list", lambda d: d.execute_script(
                "return [...document.querySelectorAll('#files .file-name')].some(e => e.textContent.includes('invoice'))"))
            shown_names = driver.execute_script(
                "return [...document.querySelectorAll('#files .file-name')].map(e => e.textContent)")
            text = driver.execute_script("return document.body.innerText")
            listed = [n for n in shown_names if "invoice" in n]
            raw = "\u202e" in text
            ok = listed == ["invoice\\u{202e}gnp.exe"] and not raw
            return ok, f"listed as {listed}; raw U+202E on the page: {raw}"
        checks.run("bidi-escaped", bidi_escaped)

        def traversal_refused():
            results = []
            for path in ("/files/../../../../etc/passwd", "/files/%2e%2e/%2e%2e/%2e%2e/etc/passwd",
                         "/files/..%2f..%2f..%2fetc%2fpasswd", "/render/..%2f..%2f..%2fetc%2fpasswd",
                         "/files/.lanmsg-partial", "/../../etc/passwd", "/files/%2fetc%2fpasswd"):
                status, _, body = raw_get(arguments.url, path)
                results.append((path, status, b"root:" in body))
            ok = all(status >= 400 and not leaked for _, status, leaked in results)
            return ok, "; ".join(f"{p} -> {s}{' LEAKED' if leaked else ''}" for p, s, leaked in results)
        checks.run("traversal-refused", traversal_refused)

        def headers():
            _, image, _ = raw_get(arguments.url, "/files/red.png")
            _, page, _ = raw_get(arguments.url, "/files/page.html")
            status, ranged, body = raw_get(arguments.url, "/files/red.png", {"Range": "bytes=0-7"})
            ok = (image.get("x-content-type-options") == "nosniff" and image.get("content-type") == "image/png"
                  and "sandbox" in page.get("content-security-policy", "") and "etag" in image
                  and status == 206 and body == b"\x89PNG\r\n\x1a\n")
            return ok, (f"red.png: {image.get('content-type')}, nosniff={image.get('x-content-type-options')}, "
                        f"etag={image.get('etag')}; page.html CSP: {page.get('content-security-policy')}; "
                        f"range 0-7 -> {status}, {len(body)} bytes")
        checks.run("file-headers", headers)

        def metrics():
            status, _, body = raw_get(arguments.url, "/metrics")
            families = {family.name: family for family in text_string_to_metric_families(body.decode())}
            accepted = families.get("lanmsg_connections_accepted")
            received = families.get("lanmsg_messages_received")
            offers = [s.value for s in (received.samples if received else []) if s.labels.get("type") == "preview.offer"]
            ok = status == 200 and accepted is not None and offers and offers[0] >= 4
            return ok, f"{len(families)} metric families parsed by prometheus_client; preview.offer received: {offers}"
        checks.run("metrics-parse", metrics)

        def phone():
            driver.set_window_size(390, 844)
            driver.refresh()
            wait(driver, "the page on a phone", lambda d: d.execute_script(
                "return document.getElementById('status').dataset.state === 'live' && document.getElementById('document')"))
            layout = driver.execute_script("""
                const v = document.getElementById('viewer').getBoundingClientRect();
                const a = document.querySelector('aside').getBoundingClientRect();
                const d = document.getElementById('document').getBoundingClientRect();
                return { viewport: innerWidth, scrollWidth: document.documentElement.scrollWidth,
                         viewerBottom: v.bottom, asideTop: a.top, documentWidth: d.width, asideWidth: a.width };""")
            driver.save_screenshot(f"{shots}/phone.png")
            ok = (layout["scrollWidth"] <= layout["viewport"] and layout["asideTop"] >= layout["viewerBottom"] - 1
                  and layout["documentWidth"] <= layout["viewport"])
            return ok, f"{layout}"
        checks.run("phone-layout", phone)
    finally:
        driver.quit()
    return 1 if checks.failed else 0


def scripted(arguments):
    """A server started with --allow-scripts: a pushed HTML file's script runs, inside its
    sandbox — an opaque origin that cannot reach the page."""
    work = arguments.work
    with open(f"{work}/app.html", "w") as f:
        f.write("<!doctype html><p id=m>not run</p>"
                "<script>document.getElementById('m').textContent = 'ran in ' + window.origin;"
                "try { parent.document.title = 'pwned' } catch (e) { document.body.dataset.blocked = 'yes' }</script>")
    checks = Checks()
    driver = browser(1280, 900)
    try:
        driver.get(arguments.url)
        live(driver)
        title = driver.title

        def allowed_but_sandboxed():
            Pusher(arguments.push).push(f"{work}/app.html")
            frame = shown(driver, "app.html")
            sandbox = frame.get_attribute("sandbox")
            driver.switch_to.frame(frame)
            try:
                marker = wait(driver, "the script's marker", lambda d: d.execute_script(
                    "const m = document.getElementById('m'); return m && m.textContent !== 'not run' ? m.textContent : null"))
                blocked = driver.execute_script("return document.body.dataset.blocked || 'no'")
            finally:
                driver.switch_to.default_content()
            ok = marker == "ran in null" and blocked == "yes" and driver.title == title and sandbox == "allow-scripts"
            return ok, (f"the script ran: {marker!r}; reaching the page was blocked: {blocked}; the page's title "
                        f"{driver.title!r}; sandbox={sandbox!r}")
        checks.run("allow-scripts-sandboxed", allowed_but_sandboxed)
    finally:
        driver.quit()
    return 1 if checks.failed else 0


def rss_kib(pid, field="VmRSS"):
    """A memory figure of `pid` in KiB from /proc: VmRSS now, VmHWM its peak."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return -1


def bench(arguments):
    """D2: push completed -> visible in the page (p50/p99), and RSS with 1,000 files listed."""
    work, inbox = arguments.work, arguments.inbox
    pusher = Pusher(arguments.push)
    driver = browser(1280, 900)
    try:
        driver.get(arguments.url)
        live(driver)
        to_event, to_visible = [], []
        for index in range(arguments.pushes):
            name = f"bench-{index:03d}.png"
            with open(f"{work}/{name}", "wb") as f:
                f.write(noisy_png(183, 182, index))  # 100 kB
            stored_at = pusher.push(f"{work}/{name}")
            wait(driver, f"{name} visible", lambda d: d.execute_script(
                "return window.previewVisible[arguments[0]]", name), timeout=30)
            arrived, visible = driver.execute_script(
                "return [window.previewArrivals[arguments[0]], window.previewVisible[arguments[0]]]", name)
            to_event.append(arrived - stored_at)
            to_visible.append(visible - stored_at)

        def pct(values, p):
            ordered = sorted(values)
            return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]
        size = os.path.getsize(f"{work}/bench-000.png")
        print(f"MEASURED D2 push result -> event in the page: p50 {pct(to_event, 50):.1f} ms, "
              f"p99 {pct(to_event, 99):.1f} ms ({len(to_event)} pushes of {size} bytes)", flush=True)
        print(f"MEASURED D2 push result -> image visible: p50 {pct(to_visible, 50):.1f} ms, "
              f"p99 {pct(to_visible, 99):.1f} ms, max {max(to_visible):.1f} ms", flush=True)
        if arguments.server_pid:
            before = rss_kib(arguments.server_pid)
            existing = len([n for n in os.listdir(inbox) if os.path.isfile(f"{inbox}/{n}") and not n.startswith(".")])
            for index in range(max(0, arguments.files - existing)):
                with open(f"{inbox}/file-{index:04d}.txt", "w") as f:
                    f.write(f"file {index}\n")
            driver.refresh()
            wait(driver, "the long list", lambda d: d.execute_script(
                "return document.querySelectorAll('#files li').length") >= arguments.files, timeout=30)
            listed = driver.execute_script("return document.querySelectorAll('#files li').length")
            for _ in range(5):  # five more page loads with the list
                driver.refresh()
                wait(driver, "the long list", lambda d: d.execute_script(
                    "return document.querySelectorAll('#files li').length") >= arguments.files, timeout=30)
            after = rss_kib(arguments.server_pid)
            started = time.time()
            status, _, body = raw_get(arguments.url, "/api/files")
            print(f"MEASURED D2 daemon RSS: {before / 1024:.1f} MiB after the pushes, {after / 1024:.1f} MiB with "
                  f"the page open and {listed} files listed (6 page loads); /api/files {len(body)} bytes in "
                  f"{(time.time() - started) * 1000:.1f} ms", flush=True)
    finally:
        driver.quit()
    return 0


def cpu_seconds(pid):
    """User + system CPU time of `pid` so far, in seconds."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def fanout(arguments):
    """D3: many pages open on one previewer (each page holds one event stream: `--pages` streams of
    /events, read as a page's EventSource reads them), `--pushes` pushes of a 100 kB PNG: from the
    pusher's result to the event at the first and at the last page (p50/p99), and the daemon's CPU
    time and RSS meanwhile."""
    import socket
    import threading
    parsed = urllib.parse.urlsplit(arguments.url)
    prefix = parsed.path.rstrip("/")
    arrivals, lock, opened, sockets = {}, threading.Lock(), threading.Semaphore(0), []

    def reader():
        connection = socket.create_connection((parsed.hostname, parsed.port), timeout=120)
        sockets.append(connection)
        connection.sendall(f"GET {prefix}/events HTTP/1.1\r\nHost: {parsed.netloc}\r\n"
                           "Accept: text/event-stream\r\n\r\n".encode())
        stream = connection.makefile("rb")
        status = stream.readline()
        while stream.readline() not in (b"\r\n", b""):
            pass
        if b" 200 " not in status:
            raise RuntimeError(f"/events answered {status!r}")
        opened.release()
        try:
            for line in stream:
                if line.startswith(b"data:"):
                    now = time.time() * 1000
                    name = json.loads(line[5:])["name"]
                    with lock:
                        arrivals.setdefault(name, []).append(now)
        except OSError:
            pass  # closed at the end

    threads = [threading.Thread(target=reader, daemon=True) for _ in range(arguments.pages)]
    for thread in threads:
        thread.start()
    for _ in threads:
        if not opened.acquire(timeout=30):
            raise RuntimeError("not every event stream opened within 30 s")
    pusher = Pusher(arguments.push)
    cpu_before = cpu_seconds(arguments.server_pid) if arguments.server_pid else 0
    started = time.time()
    to_first, to_last = [], []
    for index in range(arguments.pushes):
        name = f"fanout-{index:03d}.png"
        with open(f"{arguments.work}/{name}", "wb") as f:
            f.write(noisy_png(183, 182, index))
        stored_at = pusher.push(f"{arguments.work}/{name}")
        deadline = time.time() + 30
        while True:
            with lock:
                times = list(arrivals.get(name, []))
            if len(times) >= arguments.pages:
                break
            if time.time() > deadline:
                raise RuntimeError(f"{name}: {len(times)} of {arguments.pages} pages heard of it within 30 s")
            time.sleep(0.001)
        to_first.append(min(times) - stored_at)
        to_last.append(max(times) - stored_at)
    elapsed = time.time() - started
    cpu = cpu_seconds(arguments.server_pid) - cpu_before if arguments.server_pid else float("nan")

    def pct(values, p):
        ordered = sorted(values)
        return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]
    print(f"MEASURED D3 {arguments.pages} pages open, {arguments.pushes} pushes of 100 kB: push result -> event at the "
          f"last page p50 {pct(to_last, 50):.1f} ms, p99 {pct(to_last, 99):.1f} ms (first page p50 "
          f"{pct(to_first, 50):.1f} ms, p99 {pct(to_first, 99):.1f} ms)", flush=True)
    if arguments.server_pid:
        print(f"MEASURED D3 daemon: {cpu:.2f} s CPU over {elapsed:.1f} s of pushes ({cpu / arguments.pushes * 1000:.1f} ms "
              f"per push, receiving it and telling {arguments.pages} pages); RSS {rss_kib(arguments.server_pid) / 1024:.1f} MiB, "
              f"peak {rss_kib(arguments.server_pid, 'VmHWM') / 1024:.1f} MiB", flush=True)
    for connection in sockets:
        connection.close()
    return 0


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mode", choices=["check", "scripted", "bench", "fanout"])
    parser.add_argument("--url", required=True)
    parser.add_argument("--push", required=True, help="the preview-push command, without the file")
    parser.add_argument("--work", required=True, help="a scratch directory for the files pushed")
    parser.add_argument("--inbox", required=True, help="the server's --directory")
    parser.add_argument("--screenshots")
    parser.add_argument("--pushes", type=int, default=100)
    parser.add_argument("--files", type=int, default=1000)
    parser.add_argument("--server-pid", type=int)
    parser.add_argument("--pages", type=int, default=50, help="fanout: event streams open at once")
    arguments = parser.parse_args()
    sys.exit({"check": check, "scripted": scripted, "bench": bench, "fanout": fanout}[arguments.mode](arguments))


if __name__ == "__main__":
    main()
