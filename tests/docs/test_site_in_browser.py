"""The docs site as a reader sees it: built, served on loopback, opened in headless Chromium.

::

    sphinx -W -n docs --> tmp/html --> http.server on 127.0.0.1:<free port>
                                            ^   (every request's status recorded)
                                            |
    Chromium (selenium, chromedriver) -- visits the start page, a guide page, the
    performance page, an API page, then searches for "caller_envs"

It fails on a console error, a missing image, stylesheet or script (any request the server
answered with an error), a dead internal link on a visited page, or a search that finds
nothing. Each page's screenshot goes to docs/_build/screenshots/ (the test prints where).
Where Chromium or chromedriver is absent the test skips, saying why; where CI is set it
fails instead.
"""

from __future__ import annotations

import http.server
import os
import shutil
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urldefrag, urlparse

import pytest

pytestmark = pytest.mark.timeout(240)

REPO = Path(__file__).resolve().parents[2]
SCREENSHOTS = REPO / "docs" / "_build" / "screenshots"
#: The pages visited, by their path in the site, and the screenshot each one gives.
PAGES = {
    "index.html": "start.png",
    "guide/caller-envs.html": "guide-caller-envs.png",
    "performance.html": "performance.png",
    "api/envmgr.html": "api-envmgr.png",
}
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--window-size=1280,1000",
]


def _missing(what: str) -> None:
    """Skip for a missing browser part, or fail where CI must run this test."""
    if os.environ.get("CI"):
        pytest.fail(
            f"{what}; CI must run the browser test (apt-get install chromium chromium-driver)"
        )
    pytest.skip(f"{what} (apt-get install chromium chromium-driver to run it)")


def _find(*names: str) -> str | None:
    return next((p for n in names if (p := shutil.which(n))), None)


class _Site(http.server.SimpleHTTPRequestHandler):
    """Serves the built site quietly, recording every path answered with an error."""

    errors: list[str]

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        pass

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        self.errors.append(f"{code} {self.path}")
        super().send_error(code, message, explain)


class _Server(http.server.ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        # A browser that closes a connection mid-reply (a search index it no longer needs)
        # is not an error of the site.
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, list[str]]]:
    """The site built from this checkout and served on a free loopback port: (base URL, errors)."""
    pytest.importorskip("sphinx", reason="the docs extra is not installed")
    pytest.importorskip("myst_parser", reason="the docs extra is not installed")
    out = tmp_path_factory.mktemp("site") / "html"
    build = subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "-n", "-q", "-j", "1", str(REPO / "docs"), str(out)],
        capture_output=True, text=True, timeout=200, cwd=REPO,
    )  # fmt: skip
    assert build.returncode == 0, build.stderr[-3000:]
    errors: list[str] = []
    handler = type("Handler", (_Site,), {"errors": errors})

    def make(*args: Any) -> http.server.SimpleHTTPRequestHandler:
        return handler(*args, directory=str(out))

    server = _Server(("127.0.0.1", 0), make)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/", errors
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """Headless Chromium driven by chromedriver, with a fresh profile."""
    chromium = _find("chromium", "chromium-browser")
    driver_path = _find("chromedriver")
    if chromium is None:
        _missing("Chromium is not installed")
    if driver_path is None:
        _missing("chromedriver is not installed")
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium (the docs extra)")
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in CHROMIUM_FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    service = webdriver.ChromeService(executable_path=driver_path)
    driver = webdriver.Chrome(options=options, service=service)
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


def _console_errors(driver: Any) -> list[str]:
    return [e["message"] for e in driver.get_log("browser") if e["level"] == "SEVERE"]


def _status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=10) as reply:  # loopback only: our server
            return int(reply.status)
    except urllib.error.HTTPError as err:
        return err.code


def test_pages_render_with_their_images_styles_and_links(
    site: tuple[str, list[str]], browser: Any
) -> None:
    base, errors = site
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    print(f"screenshots: {SCREENSHOTS}")
    checked: dict[str, int] = {}
    for page, shot in PAGES.items():
        browser.get(base + page)
        assert browser.execute_script("return document.readyState") == "complete", page
        assert _console_errors(browser) == [], page
        broken_images = browser.execute_script(
            "return Array.from(document.images)"
            ".filter(i => !i.complete || i.naturalWidth === 0).map(i => i.src)"
        )
        assert broken_images == [], f"{page}: images that did not load"
        unstyled = browser.execute_script(
            "return Array.from(document.querySelectorAll('link[rel=stylesheet]'))"
            ".filter(l => !l.sheet).map(l => l.href)"
        )
        assert unstyled == [], f"{page}: stylesheets that did not load"
        assert browser.execute_script("return document.styleSheets.length") > 0, page
        links = browser.execute_script(
            "return Array.from(document.querySelectorAll('a[href]')).map(a => a.href)"
        )
        internal = {urldefrag(u).url for u in links if u.startswith(base)}
        assert internal, f"{page}: no internal links at all"
        for url in sorted(internal - set(checked)):
            checked[url] = _status(url)
        browser.save_screenshot(str(SCREENSHOTS / shot))
    dead = {u: s for u, s in checked.items() if s != 200}
    assert dead == {}, "dead internal links"
    assert errors == [], "requests the server could not answer"
    assert len(checked) > 20  # the navigation reaches every page of the site
    assert all((SCREENSHOTS / shot).stat().st_size > 10_000 for shot in PAGES.values())


def test_search_finds_caller_envs(site: tuple[str, list[str]], browser: Any) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    base, errors = site
    browser.get(base + "search.html?q=caller_envs")

    def results(driver: Any) -> list[str]:
        items = driver.find_elements(By.CSS_SELECTOR, "#search-results li a")
        return [urlparse(a.get_attribute("href")).path for a in items]

    found = WebDriverWait(browser, 30).until(results)
    assert "/guide/caller-envs.html" in found, found
    assert _console_errors(browser) == []
    assert errors == []
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    browser.save_screenshot(str(SCREENSHOTS / "search-caller_envs.png"))
