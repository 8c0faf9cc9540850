"""The report page and each result's ``_repr_html_``, opened the way a reader opens them: in a real
browser (headless Chromium driven by selenium), in a 1280 × 900 window.

Reading the HTML as text (``test_report.py``) cannot tell whether an embedded PNG decodes, whether the
browser reports an error, whether a wide table pushes the page sideways or whether the claims and the
headings are laid out at all. Here, on each page:

- every ``<img>`` is decoded (``complete``, natural width and height above 0);
- the browser's console holds no SEVERE entry (a failed resource, a script or parse error);
- nothing overflows horizontally at 1280 px: the document is no wider than the viewport, and no element
  ends past its right edge, except inside a box that scrolls it (``overflow-x: auto``, as ``div.table``);
- what a reader looks for is shown with a size: the claims table and every section heading (``h2``) of
  the report, the heading (``h4``) of a result's ``_repr_html_``, for every kind of result.

A screenshot of the report's first screen goes to ``$ATTNLENS_TEST_ARTIFACTS`` (default: ``test-artifacts/``
at the repository root), for a person to look at.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import attnlens
from attnlens.io.results import REGISTRY
from tiny_models import skip_unless_ci

CHROMIUM, CHROMEDRIVER = Path("/usr/bin/chromium"), Path("/usr/bin/chromedriver")
WIDTH, HEIGHT = 1280, 900
ARTIFACTS = Path(os.environ.get("ATTNLENS_TEST_ARTIFACTS", Path(__file__).resolve().parent.parent / "test-artifacts"))
# Without the network switches Chromium keeps trying to reach Google's services; this machine has no network.
FLAGS = [
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
]


@pytest.fixture(scope="session")
def browser(tmp_path_factory):
    """Headless Chromium at 1280 × 900, with its console log kept; the driver and browser are Debian's
    (``apt-get install chromium chromium-driver``), so selenium's driver manager never runs."""
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        skip_unless_ci("the browser tests need selenium (pip install -e '.[test]')")
    missing = [str(path) for path in (CHROMIUM, CHROMEDRIVER) if not path.is_file()]
    if missing:
        skip_unless_ci(f"the browser tests need {', '.join(missing)} (apt-get install chromium chromium-driver)")
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in [*FLAGS, f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}"]:
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(executable_path=str(CHROMEDRIVER)), options=options)
    try:
        driver.set_window_size(WIDTH, HEIGHT)
        yield driver
    finally:
        driver.quit()


def open_page(driver, path: Path) -> None:
    """Load ``path`` (returns once it and its images have loaded), its console log alone in the buffer."""
    driver.get_log("browser")  # drain what earlier pages logged
    driver.get(path.resolve().as_uri())
    assert driver.execute_script("return window.innerWidth") == WIDTH, "the page is laid out at 1280 px"


# The outermost elements whose right edge is past the viewport's, unless an ancestor scrolls them sideways.
OVERFLOWING = """
const width = document.documentElement.clientWidth;
const past = (element) => element.getBoundingClientRect().right > width + 0.5;
const scrolls = (element) => ["auto", "scroll"].includes(getComputedStyle(element).overflowX);
const scrolled = (element) => { for (let up = element.parentElement; up; up = up.parentElement) if (scrolls(up)) return true; return false; };
return Array.from(document.body.querySelectorAll("*"))
    .filter((element) => past(element) && !scrolled(element) && !past(element.parentElement))
    .map((element) => `<${element.tagName.toLowerCase()} class="${element.className}"> ends at `
        + `${Math.round(element.getBoundingClientRect().right)} px: ${(element.textContent || "").trim().slice(0, 60)}`);
"""

UNDECODED = """
return Array.from(document.images)
    .filter((image) => !(image.complete && image.naturalWidth > 0 && image.naturalHeight > 0))
    .map((image) => image.alt || image.src.slice(0, 60));
"""


def problems(driver, shown: list) -> list[str]:
    """What is wrong with the open page: undecoded images, SEVERE console entries, horizontal
    overflow, and elements of ``shown`` that are not displayed with a size."""
    found = [f"image not decoded: {name}" for name in driver.execute_script(UNDECODED)]
    found += [f"console: {entry['message']}" for entry in driver.get_log("browser") if entry["level"] == "SEVERE"]
    wide, viewport = driver.execute_script("return [document.documentElement.scrollWidth, document.documentElement.clientWidth]")
    if wide > viewport:
        found.append(f"the document is {wide} px wide, wider than the {viewport} px viewport")
    found += [f"overflows: {element}" for element in driver.execute_script(OVERFLOWING)]
    for element in shown:
        if not (element.is_displayed() and element.size["width"] > 0 and element.size["height"] > 0):
            found.append(f"not shown: <{element.tag_name}> {element.text[:60]!r} (size {element.size})")
    return found


# What a reader meets on the page: tables wider than their box, figures shown smaller than their text
# reads (below 800 px and below 60% of their drawn size, without a link to the full image), and a
# section's answer (its first paragraph) of 60 words or more.
READABILITY = """
const found = [];
document.querySelectorAll("div.table").forEach((box) => {
    if (box.scrollWidth > box.clientWidth + 1) found.push(`a table ${box.scrollWidth} px wide in a box of ${box.clientWidth}: `
        + box.textContent.trim().slice(0, 50));
});
document.querySelectorAll("img").forEach((image) => {
    const shown = image.getBoundingClientRect().width;
    if (!shown) return;  // folded away: it is shown at its full width when opened
    const linked = image.closest("a") && image.closest("a").getAttribute("href").endsWith(".png");
    if (shown < Math.min(800, 0.6 * image.naturalWidth) && !linked) found.push(`a figure at ${Math.round(shown)} of `
        + `${image.naturalWidth} px: ${image.alt}`);
});
document.querySelectorAll("p.answer").forEach((answer) => {
    const words = answer.textContent.trim().split(/\\s+/).length;
    if (words >= 60) found.push(`an answer of ${words} words: ${answer.textContent.slice(0, 50)}`);
});
return found;
"""


def test_report_page_in_a_browser(browser, quick_report):
    from selenium.webdriver.common.by import By

    open_page(browser, quick_report / "report.html")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    screenshot = ARTIFACTS / "report-first-screen.png"
    assert browser.save_screenshot(str(screenshot))
    print(f"screenshot of the report's first screen: {screenshot}")

    claims = browser.find_element(By.CSS_SELECTOR, "section#claims table.claims")
    assert "papers report" in claims.get_attribute("textContent"), "the first table is the claims table"
    rows = claims.find_elements(By.CSS_SELECTOR, "tbody tr")
    bottom = max(row.rect["y"] + row.rect["height"] for row in rows)
    assert bottom <= HEIGHT, f"every claim and its verdict on the first screen ({bottom:.0f} px of {HEIGHT})"
    headings = browser.find_elements(By.TAG_NAME, "h2")
    assert len(headings) >= 7, "a heading per section"
    assert browser.execute_script("return document.images.length") == len(list(quick_report.glob("*/figures/*.png")))
    for folded in browser.find_elements(By.TAG_NAME, "details"):  # open every fold: its tables and figures too
        browser.execute_script("arguments[0].open = true", folded)
    assert browser.execute_script(READABILITY) == []
    assert problems(browser, [claims, *headings]) == []


def test_the_readme_figure_is_the_report_first_screen(quick_report, tmp_path, browser):
    """scripts/readme_claims.py's screenshot: the report page's first screen at 1,280 px."""
    import importlib.util

    from PIL import Image

    root = Path(__file__).resolve().parent.parent
    spec = importlib.util.spec_from_file_location("readme_claims", root / "scripts" / "readme_claims.py")
    generator = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(generator)
    generator.screenshot(quick_report / "report.html", tmp_path / "first.png")
    with Image.open(tmp_path / "first.png") as image:
        assert image.size[0] == generator.WIDTH and image.size[1] >= 600


def _moments(directory: Path) -> Path:
    """A small moments result (the merged moments inside a job's directory): the quick report writes none."""
    return attnlens.run_moments("minilm-l6", directory, seq_len=16, num_seqs=4, batch_size=2, layers=[0, 3], progress=False).path


def _sinks(directory: Path) -> Path:
    """A small sinks result with its figures (the quick report's model is an encoder: it runs no sinks stage)."""
    result = attnlens.sinks("minilm-l6", num_seqs=4, seq_len=32, min_keys=8, progress=False)
    result.save(directory)
    result.save_figures(directory / "figures", formats=("png",))
    return directory


# A small result of each kind the quick report does not hold.
BUILDERS = {"moments": _moments, "sinks": _sinks}


def test_repr_html_of_every_result_kind_in_a_browser(browser, quick_report, tmp_path):
    from selenium.webdriver.common.by import By

    report = attnlens.load_result(quick_report)
    paths = [quick_report, *(quick_report / name for name in report.meta["results"].values())]
    held = {attnlens.load_result(path).kind for path in paths}
    missing = [kind for kind in REGISTRY if kind not in held]
    assert set(missing) <= set(BUILDERS), f"no result of kind {set(missing) - set(BUILDERS)}: add a builder to BUILDERS"
    paths += [BUILDERS[kind](tmp_path / kind) for kind in missing]

    covered, found = set(), {}
    for index, path in enumerate(paths):
        result = attnlens.load_result(path)
        page = tmp_path / f"repr_{index}_{result.kind}.html"
        page.write_text(f'<!doctype html><html><head><meta charset="utf-8"></head><body>{result._repr_html_()}</body></html>')
        open_page(browser, page)
        draws = any(path.glob("figures/*.png"))  # the report saved the figures of each of its results
        images = browser.execute_script("return document.images.length")
        assert images == int(draws), f"{path.name}: the main figure, if the result has figures"
        headings = browser.find_elements(By.TAG_NAME, "h4")
        assert len(headings) == 1, f"{path.name}: one heading"
        found[path.name] = problems(browser, headings)
        covered.add(result.kind)
    assert {name: said for name, said in found.items() if said} == {}
    assert covered == set(REGISTRY), "every kind of result is checked"
