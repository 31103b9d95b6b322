"""The documentation site in a real browser: Debian's chromium, headless, on the `mkdocs build` output served on
localhost, in a 1280-px window. On the home page and the results pages every figure loads, fits the text column,
is drawn for that column (its text, by the PNG's own size in inches, at least ~12 px on screen), and opens full
size on click (a link to its SVG or PNG, which the site serves).

The measuring is done in the browser by a page this test adds to the built site: it loads each page in a 1280-px
iframe, measures it, and writes the result into its own DOM, which `chromium --dump-dom` prints. Without chromium
the test fails and says how to install it (`apt-get install chromium`, as .ci/run does)."""

import functools
import http.server
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import urllib.parse
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = ["", "results/", "evidence_round2_results/", "gsm8k_forward_lag/"]
WINDOW = 1280
# On screen, a point of the figure's own text must be at least this many pixels (9-pt labels at least ~12 px): a
# figure drawn for the column (7.5 in) gives ~1.36 px per point at a 1280-px window, a 12.5-in one ~0.8.
MIN_PX_PER_POINT = 1.25

CHECK_PAGE = """<!doctype html><meta charset="utf-8"><title>check</title><body>
<iframe id="f" style="width:%(window)dpx;height:900px;border:0"></iframe><pre id="out">running</pre>
<script>
const pages = %(pages)s, results = {};
async function check(page) {
  const frame = document.getElementById("f");
  await new Promise(done => { frame.onload = done; frame.src = "/" + page; });
  const doc = frame.contentDocument;
  const images = [...doc.querySelectorAll("article img")];
  await Promise.all(images.map(img => img.complete ? null : new Promise(done => { img.onload = img.onerror = done; })));
  const column = doc.querySelector("article").getBoundingClientRect().width;
  const figures = [];
  for (const img of images) {
    const link = img.closest("a");
    let target = null;
    if (link) { target = (await fetch(link.href, {method: "HEAD"})).status; }
    figures.push({src: img.getAttribute("src"), shown: img.getBoundingClientRect().width, natural: img.naturalWidth,
                  href: link ? link.getAttribute("href") : null, target: target});
  }
  return {column: column, figures: figures};
}
(async () => {
  for (const page of pages) { results[page] = await check(page); }
  document.getElementById("out").textContent = "RESULT " + JSON.stringify(results) + " END";
})();
</script>"""


def chromium():
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    assert path, "chromium is not installed: `apt-get install chromium` (Debian's package; .ci/run installs it)"
    return path


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    out = tmp_path_factory.mktemp("site")
    build = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert build.returncode == 0, build.stderr[-3000:]
    (out / "__check.html").write_text(CHECK_PAGE % {"window": WINDOW, "pages": json.dumps(PAGES)}, encoding="utf-8")
    handler = functools.partial(QuietHandler, directory=str(out))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", out
    server.shutdown()


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


def run_chromium(args, profile):
    command = [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
               "--disable-component-update", "--disable-sync", "--no-first-run", f"--user-data-dir={profile}",
               f"--window-size={WINDOW},900", *args]  # fmt: skip
    return subprocess.run(command, capture_output=True, text=True, timeout=120)


def inches_wide(png):
    """The PNG's width in inches, from the resolution matplotlib writes into it."""
    from PIL import Image

    with Image.open(png) as image:
        return image.width / image.info["dpi"][0]


def test_figures_fit_the_column_and_open_full_size(site, tmp_path):
    url, out = site
    done = run_chromium(["--virtual-time-budget=30000", "--dump-dom", f"{url}/__check.html"], tmp_path / "profile")
    found = re.search(r"RESULT (\{.*?\}) END", done.stdout, re.DOTALL)
    assert found, f"the check page did not finish in chromium:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
    results = json.loads(found.group(1).replace("&quot;", '"').replace("&amp;", "&"))
    problems, figures = [], 0
    for page, r in results.items():
        assert 600 < r["column"] < WINDOW, f"/{page}: text column {r['column']} px at a {WINDOW}-px window"
        for f in r["figures"]:
            figures += 1
            where = f"/{page} {f['src']}"
            if not f["natural"]:
                problems.append(f"{where}: did not load")
                continue
            if f["shown"] > r["column"] + 1:
                problems.append(f"{where}: {f['shown']:.0f} px wide in a {r['column']:.0f}-px column")
            png = out / urllib.parse.urlparse(urllib.parse.urljoin(f"{url}/{page}", f["src"])).path.lstrip("/")
            px_per_point = f["shown"] / inches_wide(png) / 72
            if px_per_point < MIN_PX_PER_POINT:
                problems.append(f"{where}: drawn {inches_wide(png):.1f} in wide, its text at {px_per_point:.2f} px per point")
            if f["href"] is None or f["target"] != 200:
                problems.append(f"{where}: no full-size view on click (link {f['href']}, status {f['target']})")
    assert figures >= 6, f"only {figures} figures found on {PAGES}: the check is broken"
    assert not problems, "figures at a 1280-px window:\n" + "\n".join(problems)


def test_home_page_renders(site, tmp_path):
    shot = tmp_path / "home.png"
    run_chromium([f"--screenshot={shot}", f"{site[0]}/"], tmp_path / "profile")
    assert shot.exists() and shot.stat().st_size > 20_000, "chromium wrote no screenshot of the home page"
