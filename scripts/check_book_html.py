"""Open the built book in headless Chromium, as a reader would, and check what each page loads.

    python scripts/check_book_html.py _build/html [--all] [--screenshots OUT_DIR]

Why: the book must work offline and show every figure. A page can build without a warning
and still pull a font or script from the web, or point at a figure that was never copied
into the site; only loading it in a browser shows that.

How: BUILD_HTML_DIR is served on 127.0.0.1 (a free port, a background thread) by
http.server, which records the status of every path it is asked for. Each page is loaded
by headless Chromium with `--log-net-log`, whose JSON lists every request the page made.
A page fails if
  - it requested anything from a host other than 127.0.0.1/localhost (data: and blob: are fine),
  - a request for a local file got a 4xx/5xx answer (a 404 is a missing file),
  - an <img src> / <script src> / stylesheet href in its HTML does not resolve to a file in
    the site (a static second layer, which also covers assets loaded late or never).
Chromium is pointed at a proxy port where nothing listens and resolves no host name, so a
request to another host is recorded but never leaves the machine. Requests Chromium makes
for itself (update checks, sign-in) carry no page origin and are ignored, and so is its
own /favicon.ico probe.

Prints one line per page (OK, or the problems with the bad URLs) and exits 1 if any page
has a problem. Default pages: the index, the training chapter and the scorecard; --all
checks every page. --screenshots OUT_DIR saves a 1280x2000 PNG of each page checked.

--tables WIDTHxHEIGHT (e.g. 1366x768, a laptop) also loads every page checked in a window
of that size and fails a page on which a table overflows: the page scrolls sideways, a
table that is in no box of its own that scrolls sideways reaches past the text column, such
a box reaches past the window, or a table's caption reaches past the box it scrolls in (a
reader would see it cut off). A script added to a copy of the page measures it, and
Chromium's --dump-dom returns what it found.
"""

import argparse
import functools
import json
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
from html.parser import HTMLParser
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urljoin, urlsplit

DEFAULT_PAGES = ["index.html", "book/_executed/01_train.html", "book/_executed/99_scorecard.html"]
LOCAL_HOSTS = {"127.0.0.1", "localhost"}
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1280,2000",
    "--hide-scrollbars",
    "--virtual-time-budget=5000",
]


class RecordingHandler(SimpleHTTPRequestHandler):
    """Serves the site quietly and appends (path, status) of every request to `self.server.seen`."""

    def log_request(self, code="-", size="-"):
        self.server.seen.append((unquote(urlsplit(self.path).path), int(code)))

    def log_message(self, *args):
        pass


class SiteServer(ThreadingHTTPServer):
    """A browser that exits while an answer is on its way (its favicon probe) is no error."""

    def handle_error(self, request, client_address):
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


def serve_site(root: Path) -> SiteServer:
    server = SiteServer(("127.0.0.1", 0), functools.partial(RecordingHandler, directory=str(root)))
    server.seen = []
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def find_chromium() -> str:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if not chromium:
        sys.exit("check_book_html: chromium not found (Debian: apt-get install -y chromium)")
    return chromium


def load_in_chromium(url: str, screenshot: Path, net_log: Path, dead_port: int) -> None:
    with tempfile.TemporaryDirectory() as profile:
        subprocess.run(
            [
                find_chromium(),
                *CHROMIUM_FLAGS,
                f"--user-data-dir={profile}",
                f"--proxy-server=http://127.0.0.1:{dead_port}",  # loopback bypasses the proxy
                "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE localhost, EXCLUDE 127.0.0.1",
                f"--log-net-log={net_log}",
                f"--screenshot={screenshot}",
                url,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=120,
        )


def requests_from_page(net_log: Path, site: str) -> list[str]:
    """URLs of the requests whose top frame (network isolation key) or initiator is our site."""
    urls = []
    for event in json.loads(net_log.read_text())["events"]:
        p = event.get("params") or {}
        if (
            "url" in p
            and "network_isolation_key" in p
            and (p["network_isolation_key"].startswith(site + " ") or p.get("initiator", "").startswith(site))
        ):
            urls.append(p["url"])
    return list(dict.fromkeys(urls))


class AssetRefs(HTMLParser):
    """Collects the URLs a page loads as it renders: <img src>, <script src>, stylesheet <link href>."""

    def __init__(self):
        super().__init__()
        self.refs = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag in ("img", "script") and a.get("src"):
            self.refs.append(a["src"])
        elif tag == "link" and "stylesheet" in (a.get("rel") or "") and a.get("href"):
            self.refs.append(a["href"])


def static_problems(root: Path, page: str) -> list[str]:
    parser = AssetRefs()
    parser.feed((root / page).read_text(encoding="utf-8"))
    problems = []
    for ref in parser.refs:
        parts = urlsplit(ref)
        if parts.scheme in ("data", "blob"):
            continue
        if parts.scheme or parts.netloc:
            problems.append(f"refers to another host: {ref}")
        elif not (root / unquote(urlsplit(urljoin("/" + page, ref)).path).lstrip("/")).is_file():
            problems.append(f"missing file: {ref}")
    return problems


def check_page(root: Path, page: str, server: SiteServer, shots: Path, dead_port: int):
    """(problems, URLs requested) of one page: off-host requests, failed local requests, missing assets."""
    if not (root / page).is_file():
        return ["page not found in the build"], []
    server.seen.clear()
    site = "http://127.0.0.1"
    screenshot = shots / (page.removesuffix(".html").replace("/", "-") + ".png")
    with tempfile.TemporaryDirectory() as tmp:
        net_log = Path(tmp) / "net.json"
        load_in_chromium(f"{site}:{server.server_port}/{page}", screenshot, net_log, dead_port)
        urls = requests_from_page(net_log, site) if net_log.is_file() else []
    if ("/" + page, 200) not in server.seen or not urls:
        return ["Chromium did not load the page, or its NetLog lists no request from it"], urls
    problems = [
        f"request to another host: {u}"
        for u in urls
        if urlsplit(u).scheme not in ("data", "blob") and urlsplit(u).hostname not in LOCAL_HOSTS
    ]
    problems += [
        f"HTTP {status}: {path}" for path, status in server.seen if status >= 400 and path != "/favicon.ico"
    ]
    return problems + static_problems(root, page), urls


TABLE_CHECK = r"""<script>
window.addEventListener('load', () => setTimeout(() => {
  const column = document.querySelector('article.bd-article') || document.querySelector('main') || document.body;
  const edge = column.getBoundingClientRect().right, view = window.innerWidth;
  const problems = [], px = x => Math.round(x);
  const page = document.documentElement.scrollWidth;
  if (page > view + 1) problems.push(`the page scrolls sideways (${page} px in a ${view} px window)`);
  const tables = document.querySelectorAll('article table');
  tables.forEach((t, i) => {
    const name = `table ${i + 1} (${(t.caption ? t.caption.textContent : t.textContent).trim().slice(0, 40)})`;
    let box = t.parentElement;
    while (box && box !== column && !['auto', 'scroll'].includes(getComputedStyle(box).overflowX)) box = box.parentElement;
    const r = t.getBoundingClientRect();
    if (!box || box === column) {
      if (r.right > edge + 1) problems.push(`${name} reaches ${px(r.right)} px, past the text column (${px(edge)} px)`);
      return;
    }
    const b = box.getBoundingClientRect();
    if (b.right > view + 1) problems.push(`${name}: its scrolling box reaches ${px(b.right)} px, past the window`);
    if (t.caption && t.caption.getBoundingClientRect().right > b.right + 1)
      problems.push(`${name}: its caption reaches ${px(t.caption.getBoundingClientRect().right)} px, past its box (${px(b.right)} px)`);
  });
  const out = document.createElement('pre');
  out.id = 'table-check';
  out.textContent = JSON.stringify({tables: tables.length, problems});
  document.body.appendChild(out);
}, 300));
</script>"""


def table_problems(root: Path, pages: list[str], size: str = "1366x768") -> dict[str, tuple[int, list[str]]]:
    """{page: (tables on it, problems)} at a `size` window (TABLE_CHECK, on a copy of the site)."""
    import html as html_lib
    import re

    width, height = size.lower().split("x")
    found = {}
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / "site"
        shutil.copytree(root, copy)
        for path in copy.rglob("*.html"):  # every page: a page may redirect to another (the root index.html)
            path.write_text(
                path.read_text(encoding="utf-8").replace("</body>", TABLE_CHECK + "</body>"), encoding="utf-8"
            )
        for page in pages:
            path = copy / page
            report = None
            for budget in (10000, 30000):  # a page with many figures can outlast the first budget
                with tempfile.TemporaryDirectory() as profile:
                    dom = subprocess.run(
                        [
                            find_chromium(),
                            *[
                                f
                                for f in CHROMIUM_FLAGS
                                if not f.startswith(("--window-size", "--virtual-time-budget"))
                            ],
                            f"--user-data-dir={profile}",
                            f"--window-size={width},{height}",
                            f"--virtual-time-budget={budget}",
                            "--dump-dom",
                            path.as_uri(),
                        ],
                        capture_output=True,
                        text=True,
                        timeout=180,
                    ).stdout
                m = re.search(
                    r'<pre id="table-check"[^>]*>(.*?)</pre>', dom, re.S
                )  # the theme may add attributes
                if m:
                    report = json.loads(html_lib.unescape(m.group(1)))
                    break
            found[page] = (
                (report["tables"], report["problems"])
                if report
                else (0, ["the page did not finish loading, so its tables were not measured"])
            )
    return found


def pages_to_check(root: Path, every: bool) -> list[str]:
    if not every:
        return DEFAULT_PAGES
    return sorted(
        p.relative_to(root).as_posix()
        for p in root.rglob("*.html")
        if not p.relative_to(root).parts[0].startswith("_")
    )


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("build_html_dir", type=Path)
    ap.add_argument("--all", action="store_true", help="check every page, not just the default three")
    ap.add_argument("--screenshots", type=Path, metavar="OUT_DIR", help="save a PNG of each page here")
    ap.add_argument(
        "--tables", metavar="WIDTHxHEIGHT", help="also check that no table overflows at this window size"
    )
    args = ap.parse_args(argv)
    root = args.build_html_dir.resolve()
    find_chromium()
    server = serve_site(root)
    dead = socket.socket()  # bound, never listening: the proxy that refuses every connection
    dead.bind(("127.0.0.1", 0))
    failed = 0
    try:
        with tempfile.TemporaryDirectory() as tmp:
            shots = args.screenshots or Path(tmp)
            shots.mkdir(parents=True, exist_ok=True)
            pages = pages_to_check(root, args.all)
            tables = table_problems(root, pages, args.tables) if args.tables else {}
            for page in pages:
                problems, urls = check_page(root, page, server, shots, dead.getsockname()[1])
                n_tables, overflows = tables.get(page, (None, []))
                problems += overflows
                failed += bool(problems)
                measured = "" if n_tables is None else f", {n_tables} tables inside the page at {args.tables}"
                print(
                    f"FAIL  {page}" + "".join(f"\n      {p}" for p in problems)
                    if problems
                    else f"OK    {page}  ({len(urls)} requests, all to 127.0.0.1{measured})"
                )
    finally:
        server.shutdown()
        dead.close()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
