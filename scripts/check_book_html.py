"""Open the built book in headless Chromium, as a reader would, and check what each page loads.

    python scripts/check_book_html.py _build/html [--all] [--screenshots OUT_DIR] [--tables WxH]

Why: the book must work offline and show every figure. A page can build without a warning
and still pull a font or script from the web, or point at a figure that was never copied
into the site; only loading it in a browser shows that.

How: BUILD_HTML_DIR is served on 127.0.0.1 (a free port, a background thread) by
http.server, which records the status of every path it is asked for. Playwright for Python
drives the system's Chromium (`chromium` on the PATH; Playwright downloads no browser) and
loads each page in a fresh context, which records every request the page makes (its frames
and workers too). A request to a host other than 127.0.0.1/localhost is answered by
Playwright's router with an error, so it never leaves the machine, and reported. A page fails if
  - it requested anything from a host other than 127.0.0.1/localhost (data: and blob: are fine),
  - a request for a local file got a 4xx/5xx answer (a 404 is a missing file),
  - an <img src> / <script src> / stylesheet href in its HTML does not resolve to a file in
    the site (a static second layer, which also covers assets loaded late or never).
Behind the router, Chromium is pointed at a proxy port where nothing listens and resolves no
host name, so a request the router does not see (Chromium's own: update checks, sign-in)
cannot leave either; those carry no page and are not counted, nor is the /favicon.ico probe.
A page is taken as loaded when its load event has fired and its network has been idle for
half a second, after any redirect (the root index.html redirects to the book's first page).

Prints one line per page (OK, or the problems with the bad URLs) and exits 1 if any page
has a problem. Default pages: the index, the training chapter and the scorecard; --all
checks every page. --screenshots OUT_DIR saves a 1280x2000 PNG of each page checked.

--tables WIDTHxHEIGHT (e.g. 1366x768, a laptop) also loads every page checked in a window
of that size and fails a page on which a table overflows: the page scrolls sideways, a
table that is in no box of its own that scrolls sideways reaches past the text column, such
a box reaches past the window, or a table's caption reaches past the box it scrolls in (a
reader would see it cut off). A script evaluated in the loaded page (TABLE_CHECK) measures
it, once its fonts are ready, and returns what it found.
"""

import argparse
import functools
import shutil
import socket
import sys
import tempfile
import threading
from html.parser import HTMLParser
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urljoin, urlsplit

try:
    from playwright.sync_api import Error as PlaywrightError
    from playwright.sync_api import sync_playwright
except ImportError:  # main() says what to install
    PlaywrightError, sync_playwright = Exception, None

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from mclib.core.atomic import write_atomic  # noqa: E402

DEFAULT_PAGES = ["index.html", "book/_executed/01_train.html", "book/_executed/99_scorecard.html"]
LOCAL_HOSTS = {"127.0.0.1", "localhost"}
SCREEN = {"width": 1280, "height": 2000}
CHROMIUM_ARGS = [  # Playwright adds --headless, --hide-scrollbars, --no-first-run and more of its own
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE localhost, EXCLUDE 127.0.0.1",
]
LOAD_TIMEOUT_MS = 120_000  # a page with many figures, on a busy machine
IDLE_TIMEOUT_MS = 15_000  # a page that keeps polling is measured as it is by then


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


def launch_chromium(playwright, dead_port: int):
    """The system's Chromium, headless; its proxy is a port that refuses every connection
    (loopback bypasses it)."""
    return playwright.chromium.launch(
        executable_path=find_chromium(),
        headless=True,
        args=[*CHROMIUM_ARGS, f"--proxy-server=http://127.0.0.1:{dead_port}"],
    )


def is_remote(url: str) -> bool:
    parts = urlsplit(url)
    return parts.scheme not in ("data", "blob") and parts.hostname not in LOCAL_HOSTS


def offline_context(browser, viewport: dict):
    """(a fresh context at `viewport`, the URLs its pages request, in order, once each): every
    request to another host is recorded, then aborted by the router before it is sent."""
    context = browser.new_context(viewport=viewport, service_workers="block")
    urls = []
    context.on("request", lambda request: urls.append(request.url))

    def route(route):
        if is_remote(route.request.url):
            route.abort("blockedbyclient")
        else:
            route.continue_()

    context.route("**/*", route)
    return context, urls


def open_page(context, url: str):
    """`url` in a new page of `context`, loaded: its load event fired, any redirect followed, and
    its network idle (or IDLE_TIMEOUT_MS passed). Raises PlaywrightError if it does not load."""
    page = context.new_page()
    page.goto(url, wait_until="load", timeout=LOAD_TIMEOUT_MS)
    for _ in range(5):  # a redirect (<meta http-equiv="Refresh">) navigates once the page has loaded
        before = page.url
        try:
            page.wait_for_load_state("networkidle", timeout=IDLE_TIMEOUT_MS)
        except PlaywrightError:
            pass
        page.wait_for_load_state("load", timeout=LOAD_TIMEOUT_MS)
        if page.url == before:
            break
    return page


def load_in_chromium(browser, url: str, screenshot: Path) -> tuple[list[str], str | None]:
    """(URLs the page requested, once each, None or why it did not load); saves a screenshot."""
    context, urls = offline_context(browser, SCREEN)
    try:
        page = open_page(context, url)
        write_atomic(screenshot, page.screenshot(timeout=LOAD_TIMEOUT_MS))
        error = None
    except PlaywrightError as e:
        error = str(e).strip().splitlines()[0]
    finally:
        context.close()
    return list(dict.fromkeys(urls)), error


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


def check_page(root: Path, page: str, server: SiteServer, browser, shots: Path):
    """(problems, URLs requested) of one page: off-host requests, failed local requests, missing assets."""
    if not (root / page).is_file():
        return ["page not found in the build"], []
    server.seen.clear()
    screenshot = shots / (page.removesuffix(".html").replace("/", "-") + ".png")
    urls, error = load_in_chromium(browser, f"http://127.0.0.1:{server.server_port}/{page}", screenshot)
    if error or ("/" + page, 200) not in server.seen or not urls:
        return [f"Chromium did not load the page, or it made no request: {error or 'no answer'}"], urls
    problems = [f"request to another host: {u}" for u in urls if is_remote(u)]
    problems += [
        f"HTTP {status}: {path}" for path, status in server.seen if status >= 400 and path != "/favicon.ico"
    ]
    return problems + static_problems(root, page), urls


TABLE_CHECK = r"""async () => {
  await document.fonts.ready;
  const column = document.querySelector('article.bd-article') || document.querySelector('main')
    || document.body;
  const edge = column.getBoundingClientRect().right, view = window.innerWidth;
  const problems = [], px = x => Math.round(x);
  const page = document.documentElement.scrollWidth;
  if (page > view + 1) problems.push(`the page scrolls sideways (${page} px in a ${view} px window)`);
  const tables = document.querySelectorAll('article table');
  tables.forEach((t, i) => {
    const label = (t.caption ? t.caption.textContent : t.textContent).trim().slice(0, 40);
    const name = `table ${i + 1} (${label})`;
    let box = t.parentElement;
    const scrolls = b => ['auto', 'scroll'].includes(getComputedStyle(b).overflowX);
    while (box && box !== column && !scrolls(box)) box = box.parentElement;
    const r = t.getBoundingClientRect();
    if (!box || box === column) {
      if (r.right > edge + 1)
        problems.push(`${name} reaches ${px(r.right)} px, past the text column (${px(edge)} px)`);
      return;
    }
    const b = box.getBoundingClientRect();
    if (b.right > view + 1)
      problems.push(`${name}: its scrolling box reaches ${px(b.right)} px, past the window`);
    const c = t.caption && t.caption.getBoundingClientRect().right;
    if (t.caption && c > b.right + 1)
      problems.push(`${name}: its caption reaches ${px(c)} px, past its box (${px(b.right)} px)`);
  });
  return {tables: tables.length, problems};
}"""


def table_problems(browser, url: str, size: tuple[int, int]) -> tuple[int, list[str]]:
    """(tables on the page at `url`, problems) in a window of `size` (width, height): TABLE_CHECK."""
    context, _ = offline_context(browser, {"width": size[0], "height": size[1]})
    try:
        report = open_page(context, url).evaluate(TABLE_CHECK)
    except PlaywrightError:
        return 0, ["the page did not finish loading, so its tables were not measured"]
    finally:
        context.close()
    return report["tables"], report["problems"]


def window_size(text: str) -> tuple[int, int]:
    """'1366x768' -> (1366, 768); anything else is an argparse error that names it."""
    width, x, height = text.lower().partition("x")
    if not (x and width.isdigit() and height.isdigit() and int(width) > 0 and int(height) > 0):
        raise argparse.ArgumentTypeError(f"want WIDTHxHEIGHT in pixels, e.g. 1366x768, not {text!r}")
    return int(width), int(height)


def pages_to_check(root: Path, every: bool) -> list[str]:
    if not every:
        return DEFAULT_PAGES
    return sorted(
        p.relative_to(root).as_posix()
        for p in root.rglob("*.html")
        if not p.relative_to(root).parts[0].startswith("_")
    )


def check_site(root: Path, pages: list[str], browser, server: SiteServer, shots: Path, size) -> int:
    """Checks `pages`, prints a line (and its problems) for each; returns how many failed."""
    failed = 0
    for page in pages:
        problems, urls = check_page(root, page, server, browser, shots)
        n_tables = None
        if size and (root / page).is_file():
            n_tables, overflows = table_problems(
                browser, f"http://127.0.0.1:{server.server_port}/{page}", size
            )
            problems += overflows
        failed += bool(problems)
        measured = "" if n_tables is None else f", {n_tables} tables inside the page at {size[0]}x{size[1]}"
        print(
            f"FAIL  {page}" + "".join(f"\n      {p}" for p in problems)
            if problems
            else f"OK    {page}  ({len(urls)} requests, all to 127.0.0.1{measured})",
            flush=True,
        )
    return failed


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("build_html_dir", type=Path)
    ap.add_argument("--all", action="store_true", help="check every page, not just the default three")
    ap.add_argument("--screenshots", type=Path, metavar="OUT_DIR", help="save a PNG of each page here")
    ap.add_argument(
        "--tables",
        type=window_size,
        metavar="WIDTHxHEIGHT",
        help="also check that no table overflows at this window size",
    )
    args = ap.parse_args(argv)
    root = args.build_html_dir.resolve()
    if not root.is_dir():
        sys.exit(f"check_book_html: no such folder: {args.build_html_dir}")
    if sync_playwright is None:
        sys.exit("check_book_html: Playwright for Python is not installed: pip install 'playwright>=1.45'")
    find_chromium()
    server = serve_site(root)
    dead = socket.socket()  # bound, never listening: the proxy that refuses every connection
    dead.bind(("127.0.0.1", 0))
    try:
        with tempfile.TemporaryDirectory() as tmp, sync_playwright() as playwright:
            shots = args.screenshots or Path(tmp)
            shots.mkdir(parents=True, exist_ok=True)
            browser = launch_chromium(playwright, dead.getsockname()[1])
            failed = check_site(root, pages_to_check(root, args.all), browser, server, shots, args.tables)
            browser.close()
    finally:
        server.shutdown()
        dead.close()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
