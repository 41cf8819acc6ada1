"""The Dagster UI in a real browser: Debian's chromium driven by Playwright against `dagster dev` on loopback.

One test, step by step as a user would: open the asset graph, materialize one source's raw_crawl with the
Materialize button, wait for the run's success on the Runs page, read the asset's metadata in the UI (its
documents count against the store, its plot rendered as an image), then edit that source's reader setting in
the recipe, reload the code location from the Deployment page and find the "code version" badge on exactly
that asset. Screenshots go to $PRETRAIN_TEST_ARTIFACTS (default: the test's tmp folder) and are copied to
.pretrain/test-artifacts/ui/ for a person to look at.

    .venv/bin/python -m pytest -q tests/ui/test_browser.py

Needs /usr/bin/chromium (`make install` installs Debian's package); Playwright never downloads a browser here.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml
from dagster import DagsterInstance

from assets.cli import main
from assets.home import ensure_dagster_home, store_url
from assets.recipe import DEMO_RECIPE
from storage.manifest import read_manifest
from storage.factory import open_store
from tests.ports import free_port

REPO = Path(__file__).resolve().parents[2]
CHROMIUM = "/usr/bin/chromium"
# Headless and quiet: without the background-networking flags chromium keeps dialling out of the closed network.
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
CHANGED, OTHER = "c4", "dolma"  # the source whose reader setting changes, and one that stays as it is
TIMEOUT_MS = 90_000  # two shared cores: a run or a reload can take tens of seconds


def write_recipe(path: Path, min_text_chars: int | None = None) -> None:
    """The demo recipe with two small JSONL sources (30 and ~10 documents); base_dir made absolute."""
    raw = yaml.safe_load(DEMO_RECIPE.read_text())
    raw["base_dir"] = str((DEMO_RECIPE.parent / raw["base_dir"]).resolve())
    c4 = next(source for source in raw["sources"] if source["name"] == "c4")
    raw["sources"] = [
        {**c4, "name": CHANGED, "inputs": ["jsonl/olmo_c4-sample.*.json.gz"]},
        {**c4, "name": OTHER, "inputs": ["jsonl/dolma_provided_documents_000.json.gz"]},
    ]
    if min_text_chars is not None:
        raw["sources"][0]["reader"] = {"min_text_chars": min_text_chars}
    # Sections naming the demo's other sources (classifier negatives, mix priors, anneal weights) go: this test is
    # about curation, and a smaller graph loads faster.
    for section in ("quality_classifier", "mixing", "training", "ablation"):
        raw.pop(section, None)
    path.write_text(yaml.safe_dump(raw, sort_keys=False))


def wait_for_server(proc: subprocess.Popen, url: str, log: Path, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"dagster dev exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(url + "/server_info", timeout=5) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(1)
    pytest.fail(f"dagster dev did not answer on {url} within {timeout:.0f} s:\n{log.read_text()[-3000:]}")


def stop_server(proc: subprocess.Popen) -> None:
    """The whole process group (webserver, daemon, code servers, run workers): SIGINT first, then SIGKILL."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(timeout=30)


def poll(check, what: str, timeout_ms: int = TIMEOUT_MS, every_s: float = 1.0, refresh=None, refresh_s: float = 20.0):
    """Call check() until it returns something truthy; fail naming `what` (the UI is watched, never slept on).
    Pages update themselves; `refresh()` (e.g. a reload) runs only every `refresh_s`, as a fallback: reloading
    more often would abort the page's own queries before they answer on a busy machine."""
    start = last_refresh = time.monotonic()
    while True:
        value = check()
        if value:
            return value
        now = time.monotonic()
        if now - start > timeout_ms / 1000:
            pytest.fail(f"timed out waiting for {what}")
        if refresh is not None and now - last_refresh > refresh_s:
            refresh()
            last_refresh = now
        time.sleep(every_s)


def metadata_value(page, key: str) -> str:
    """The Value cell of one row of an asset page's metadata table."""
    row = page.locator(f"xpath=//tr[td[1][normalize-space()='{key}']]")
    row.first.wait_for(timeout=TIMEOUT_MS)
    return row.first.locator("td").last.inner_text().strip()


def catalog_status(page) -> dict[str, str]:
    """{asset key ("curation/c4/raw_crawl"): the text of its row in the Catalog}. The catalog is a virtualized
    table of divs: from each asset's link, climb to the element that also holds its status."""
    return page.evaluate("""() => {
        const rows = {};
        for (const link of document.querySelectorAll("a[href^='/assets/']")) {
            let row = link.parentElement;
            while (row && !/materialized/i.test(row.innerText)) row = row.parentElement;
            if (row) rows[decodeURIComponent(link.getAttribute("href").slice("/assets/".length))] = row.innerText;
        }
        return rows;
    }""")


@pytest.mark.slow  # ~1-2 minutes: dagster dev start, one UI run, one reload
@pytest.mark.timeout(600)
def test_materialize_from_the_ui_and_see_what_a_recipe_change_makes_stale(tmp_path, monkeypatch):
    from playwright.sync_api import TimeoutError as PlaywrightTimeout
    from playwright.sync_api import expect, sync_playwright

    assert Path(CHROMIUM).is_file(), f"{CHROMIUM} is missing: `make install` installs Debian's chromium package"
    artifacts = Path(os.environ.get("PRETRAIN_TEST_ARTIFACTS") or tmp_path / "artifacts")
    artifacts.mkdir(parents=True, exist_ok=True)
    recipe = tmp_path / "recipe.yaml"
    write_recipe(recipe)
    monkeypatch.setenv("PRETRAIN_RECIPE", str(recipe))
    ensure_dagster_home()  # the private instance conftest points DAGSTER_HOME at, with its dagster.yaml
    # Create its SQLite databases now: the server and the materialization below would otherwise race to
    # create (stamp) them, and one of them fails with "UNIQUE constraint failed: alembic_version".
    DagsterInstance.get().get_runs(limit=1)

    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log = artifacts / "dagster-dev.log"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    started = time.monotonic()
    with open(log, "wb") as out:
        # Its own session: the group is killed as one, and SIGINT is not inherited as ignored.
        server = subprocess.Popen(
            [str(Path(sys.executable).parent / "dagster"), "dev", "-w", str(REPO / "workspace.yaml"), "-h", "127.0.0.1", "-p", str(port)],
            cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )
    shots: list[str] = []
    try:
        # While the server starts: the other source's raw_crawl, materialized outside the UI, so the "not
        # stale" assertion below is about a materialized asset, not one never run.
        assert main(["materialize", "--select", f"curation/{OTHER}/raw_crawl"]) == 0
        wait_for_server(server, base, log)

        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
            page = browser.new_page(viewport={"width": 1600, "height": 1000})
            page.set_default_timeout(TIMEOUT_MS)
            # The first visit shows a "Join the Dagster community" dialog; dismiss it whenever it blocks a click.
            page.add_locator_handler(page.get_by_role("button", name="Skip"), lambda skip: skip.click())

            def shot(name: str) -> None:
                path = artifacts / f"{len(shots) + 1:02d}-{name}.png"
                page.screenshot(path=str(path))
                shots.append(path.name)

            # 1. The asset graph: the pipeline's groups, curation expanded to show its assets.
            def open_graph(name: str) -> None:
                """The global lineage graph, with the curation group opened (double-click; the UI remembers it)."""
                page.goto(base + "/asset-groups")
                page.get_by_text("tokenization", exact=True).first.wait_for()
                nodes = page.get_by_text("raw_crawl", exact=True).filter(visible=True)
                try:
                    nodes.first.wait_for(timeout=5000)
                except PlaywrightTimeout:
                    page.get_by_text("curation", exact=True).filter(visible=True).last.dblclick()
                    nodes.first.wait_for()
                try:  # the nodes' colours (materialized, stale) arrive with later queries; a picture without them shows little
                    page.wait_for_load_state("networkidle", timeout=15000)
                except PlaywrightTimeout:
                    pass
                shot(name)

            open_graph("asset-graph")

            # 2. Materialize the changed source's raw_crawl from its page.
            page.goto(f"{base}/assets/curation/{CHANGED}/raw_crawl")
            page.get_by_text("its inputs read and normalized to documents").first.wait_for()  # the description
            page.locator("button:has(span:text-is('Materialize'))").click()
            toast = page.get_by_text(re.compile(r"Launched run [0-9a-f]{8}"))
            run_id = re.search(r"[0-9a-f]{8}", toast.inner_text()).group(0)
            shot("run-launched")

            # 3. Its run succeeds: found on the Runs page, its own page watched until its status says so.
            page.goto(base + "/runs")
            run_url = base + page.locator(f"a[href^='/runs/{run_id}']").first.get_attribute("href")

            page.goto(run_url)
            page.get_by_text(run_id).first.wait_for()

            def run_succeeded():
                assert page.get_by_text("Failure", exact=True).count() == 0, f"run {run_id} failed; see {log}"
                return page.get_by_text("Success", exact=True).count() > 0

            poll(run_succeeded, f"run {run_id} to succeed", refresh=page.reload)
            shot("run-success")

            # 4. Its metadata in the UI, against the store.
            page.goto(f"{base}/assets/curation/{CHANGED}/raw_crawl")
            documents = int(metadata_value(page, "documents"))
            prefix = metadata_value(page, "prefix")
            shot("metadata")
            store = open_store(store_url())
            manifest = read_manifest(store, prefix)
            assert manifest is not None, f"no manifest under {prefix} in {store_url()}"
            parts = [f"{prefix}/{f['path']}" for f in manifest["files"] if f["path"].startswith("part-")]
            in_store = sum(1 for key in parts for line in gzip.decompress(store.get_bytes(key)).splitlines() if line.strip())
            assert documents == manifest["counts"]["kept"] == in_store > 0

            # ... and its plot, a PNG the browser actually decodes.
            page.locator("xpath=//tr[td[1][normalize-space()='records_plot']]").get_by_text("[Show Markdown]").click()
            image = page.locator("img[src^='data:image/png;base64,']").first
            image.wait_for()
            assert image.evaluate("img => img.complete && img.naturalWidth") > 100
            shot("records-plot")
            page.keyboard.press("Escape")

            # 5. Change that source's reader setting, reload the code location from the Deployment page.
            write_recipe(recipe, min_text_chars=20)
            page.goto(base + "/locations")
            reload = page.locator("button:has(span:text-is('Reload'))").first
            reload.click()
            shot("reloading")
            # Leaving the page would abort the reload request: wait until the button is no longer busy.
            try:
                page.wait_for_function("b => b.disabled", arg=reload.element_handle(), timeout=5000)
            except PlaywrightTimeout:
                pass  # already done
            poll(reload.is_enabled, "the code location to reload")

            # 6. The catalog shows the "code version" badge on exactly that source's raw_crawl.
            page.goto(base + "/assets")

            def changed_assets():
                rows = catalog_status(page)
                (artifacts / "catalog.json").write_text(json.dumps(rows, indent=1))  # what was seen, for a failure
                loaded = rows and not any("Loading" in status for status in rows.values())
                return rows if loaded and any("Code version" in status for status in rows.values()) else None

            rows = poll(changed_assets, "the catalog to show a code-version change", refresh=page.reload)
            shot("catalog-after-reload")
            assert len(rows) >= 10, rows  # every asset of the two sources has its row
            assert {key for key, status in rows.items()
                        if "Code version" in status and "/inputs" not in key} == {f"curation/{CHANGED}/raw_crawl"}
            assert "Materialized" in rows[f"curation/{OTHER}/raw_crawl"]

            # On the asset page: the Unsynced tag, whose tooltip names the cause.
            page.goto(f"{base}/assets/curation/{CHANGED}/raw_crawl")
            page.get_by_text("Unsynced (1)").hover()
            expect(page.get_by_text("1 code version change")).to_be_visible()
            expect(page.get_by_text("has a new code version")).to_be_visible()
            shot("unsynced-tooltip")
            page.goto(f"{base}/assets/curation/{OTHER}/raw_crawl")
            page.locator("tr", has_text="documents").first.wait_for()  # its metadata has loaded
            # (A second look only: the catalog above, with every status loaded, is the exact check.)
            assert page.get_by_text("Unsynced").count() == 0
            shot("other-source-fresh")

            open_graph("asset-graph-after-reload")
            browser.close()
    finally:
        stop_server(server)
        keep = REPO / ".pretrain" / "test-artifacts" / "ui"
        shutil.rmtree(keep, ignore_errors=True)
        shutil.copytree(artifacts, keep)
        print(f"UI test: {time.monotonic() - started:.0f} s; screenshots {shots} in {artifacts} and {keep}")
