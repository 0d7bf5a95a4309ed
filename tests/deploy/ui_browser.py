"""The Dagster UI checked in a real browser: headless Chromium (Debian's package) driven by Playwright.

Three views, as a user opens them: the asset graph shows every asset; a partition's page shows the
materialization's `mode`, `reason` and versions; every asset's checks show as succeeded. Each page
is saved as a screenshot (and its text) under `shots`, kept after the test, failed or not."""

from __future__ import annotations

import os
import re
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

# Chromium as root in a sandbox with no internet: no sandbox, no GPU, no background connections
# (the closed network refuses them, many at a time).
SETTLE_SECONDS = 30  # what a page's later queries may take to show what a check looks for

CHROMIUM_ARGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync")


def chromium() -> str:
    """The Chromium executable: $LAMINAR_CHROMIUM, else `chromium` or `chromium-browser` on PATH."""
    found = os.environ.get("LAMINAR_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    if not found:
        raise AssertionError("Chromium not found: `make test` installs Debian's `chromium` package "
                             "(or install it yourself, or point LAMINAR_CHROMIUM at a Chromium binary)")
    return found


@dataclass(frozen=True)
class PartitionFacts:
    """What the partition page must show, from the instance's latest materialization of that partition."""

    asset: str
    partition: str
    mode: str
    reason: str
    versions_to: dict


class Browser:
    """One headless Chromium page on the Dagster UI at `base`; `shots` keeps every page it opened."""

    def __init__(self, base: str, shots: Path) -> None:
        from playwright.sync_api import sync_playwright

        self.base, self.shots = base.rstrip("/"), shots
        shots.mkdir(parents=True, exist_ok=True)
        self._pw = sync_playwright().start()
        try:
            self._browser = self._pw.chromium.launch(executable_path=chromium(), args=list(CHROMIUM_ARGS))
            self.page = self._browser.new_page(viewport={"width": 2400, "height": 1400})
            # Dagster shows a "Join the Dagster community" modal on localhost a second after the first
            # page load of a new browser profile; mark it dismissed, as the modal's Skip button does.
            self.page.add_init_script("window.localStorage.setItem('communityNux', JSON.stringify('1'))")
        except BaseException:
            self._pw.stop()
            raise

    def close(self) -> None:
        try:
            self._browser.close()
        finally:
            self._pw.stop()

    def open(self, path: str, name: str, *, wait_for: str, shows: Callable[[str], bool] | None = None) -> str:
        """Load `path`, wait until `wait_for` is on the page, dismiss Dagster's first-visit modal,
        save a screenshot and the page text as `name`, and return the text. With `shows`, wait until
        the page's text satisfies it (at most `SETTLE_SECONDS`; the caller's check then names what is
        missing) instead of a fixed 1.5 s for the page's remaining queries to settle."""
        self.page.goto(self.base + path)
        try:
            self.page.get_by_text(wait_for, exact=True).first.wait_for(timeout=60_000)
        except BaseException:
            self.save(name)  # what the page showed instead
            raise
        if shows is None:
            self.page.wait_for_timeout(1500)  # let the remaining queries of the page settle
        else:
            deadline = time.monotonic() + SETTLE_SECONDS
            while not shows(self.page.inner_text("body")) and time.monotonic() < deadline:
                self.page.wait_for_timeout(200)
        return self.save(name)

    def save(self, name: str) -> str:
        text = self.page.inner_text("body")
        self.page.screenshot(path=str(self.shots / f"{name}.png"), full_page=True)
        (self.shots / f"{name}.txt").write_text(text)
        return text

    def fail(self, name: str, message: str) -> AssertionError:
        return AssertionError(f"{message} (screenshot: {self.shots / name}.png)")


def check_asset_graph(browser: Browser, assets: list[str]) -> None:
    """The global lineage with every group expanded shows a node for every asset."""
    browser.open("/asset-groups", "lineage", wait_for="Global asset lineage")
    for _ in range(10):  # expand the collapsed groups one by one (each click re-renders the graph)
        unfold = browser.page.locator('[aria-label="unfold_more"]')
        if not unfold.count():
            break
        unfold.first.click()
        browser.page.wait_for_timeout(1000)
    # The URL now names the expanded groups; loading it again fits the whole graph into view (nodes
    # out of view are not rendered).
    browser.open(browser.page.url.removeprefix(browser.base), "lineage", wait_for="Global asset lineage")
    for _ in range(12):  # a graph taller than the view (seven flows in one group) needs zooming out
        missing = [a for a in assets if not browser.page.get_by_text(a, exact=True).count()]
        if not missing:
            break
        browser.page.locator('[aria-label="zoom_out"]').first.click()
        browser.page.wait_for_timeout(800)
    if missing:
        raise browser.fail("lineage", f"the asset graph does not show {missing}")


def check_partition_page(browser: Browser, facts: PartitionFacts) -> None:
    """The asset's Partitions view, with one partition selected, shows its mode, reason and versions."""
    name = f"partition_{facts.asset}"
    text = browser.open(f"/assets/{facts.asset}?view=partitions&partition={facts.partition}", name,
                        wait_for="Latest materialization", shows=lambda text: not _partition_missing(text, facts))
    missing = _partition_missing(text, facts)
    if missing:
        raise browser.fail(name, f"{facts.asset} {facts.partition}: the page does not show {missing}")


def _partition_missing(text: str, facts: PartitionFacts) -> str | None:
    """The first of the partition's facts the page's text does not show, or None."""
    for key, value in (("mode", facts.mode), ("reason", facts.reason)):
        if not re.search(rf"^{key}\s*\n\s*{value}\s*$", text, re.M):
            return f"{key} = {value}"
    if "versions_to" not in text or any(f'"{table}": {version}' not in text
                                        for table, version in facts.versions_to.items()):
        return f"versions_to {facts.versions_to}"
    return None


def check_asset_checks(browser: Browser, asset: str, checks: list[str]) -> None:
    """The asset's Checks view lists each of `checks` as Succeeded."""
    name = f"checks_{asset}"
    text = browser.open(f"/assets/{asset}?view=checks", name, wait_for=checks[0],
                        shows=lambda text: all(_check_status(text, c) == "Succeeded" for c in checks))
    for check in checks:
        status = _check_status(text, check)
        if status != "Succeeded":
            raise browser.fail(name, f"{asset}: check `{check}` shows '{status}', expected 'Succeeded'")


def _check_status(text: str, check: str) -> str:
    # the list shows each check's name (twice: label and tooltip) and then its latest status
    match = re.search(rf"^{check}\s*\n(?:{check}\s*\n)?(\w[\w ]*)$", text, re.M)
    return match.group(1).strip() if match else "not listed"


def check_partition_plots(browser: Browser, asset: str, *metrics: str) -> None:
    """The asset's Overview plots its numeric metadata by partition (the default view) with each of
    `metrics` among the plots, instead of Dagster's empty state."""
    name = f"plots_{asset}"
    browser.open(f"/assets/{asset}", name, wait_for="Metadata")
    browser.page.get_by_text("Plots", exact=True).first.click()
    browser.page.wait_for_timeout(3000)
    text = browser.save(name)
    for metric in metrics:
        if "Asset plots are automatically generated" in text or not re.search(rf"^{metric}$", text, re.M):
            raise browser.fail(name, f"{asset}: the partition plots do not show `{metric}`")
