"""Drives the paybus console in Debian's chromium (playwright, system browser).

Usage: console_browser.py BASE_URL ADMIN_TOKEN SCREENSHOT_DIR CHROMIUM_PATH
Called by console_browser.rs, which seeds the rows and checks the database afterwards.
"""

import re
import sys

from playwright.sync_api import expect, sync_playwright

base, token, shots, chromium = sys.argv[1:5]


def shot(page, name):
    page.screenshot(path=f"{shots}/{name}.png", full_page=True)


with sync_playwright() as playwright:
    browser = playwright.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
    page = browser.new_page(viewport={"width": 1280, "height": 800})
    page.set_default_timeout(10_000)

    # Not logged in: the console sends us to the login page.
    page.goto(f"{base}/console")
    expect(page).to_have_url(re.compile(r"/console/login$"))
    page.fill("#token", token)
    shot(page, "1-login")
    page.get_by_role("button", name="Log in").click()

    # Dead letters, grouped: the biggest group first.
    expect(page).to_have_url(re.compile(r"/console/dead-letters$"))
    groups = page.locator("tr.group")
    expect(groups).to_have_count(2)
    expect(groups.first).to_have_attribute("data-function", "confirm-withdrawal")
    expect(groups.first.locator("td.n")).to_have_text("2")
    shot(page, "2-dead-letters")

    # Dry run: the seeded letters name a withdrawal that does not exist, so both need a human
    # and nothing is sent.
    groups.first.get_by_role("button", name="Dry run").click()
    expect(page.locator("p.flash[role=status]")).to_contain_text("Dry run of group confirm-withdrawal")
    expect(page.locator("p.flash[role=status]")).to_contain_text("needs_human: 2")
    expect(page.locator("p.flash[role=status]")).to_contain_text("safe: 0")
    shot(page, "3-dry-run")

    # Drill down into the group: its letters.
    page.get_by_role("link", name="confirm-withdrawal").click()
    expect(page.locator("tbody tr")).to_have_count(2)
    expect(page.locator("body")).to_contain_text("withdrawal 9001 not found")
    shot(page, "4-group")

    # Bonus jobs: the FAILED one, retried.
    page.get_by_role("link", name="Bonus jobs").click()
    failed = page.locator("tr.job[data-status='FAILED']")
    expect(failed).to_have_count(1)
    expect(failed).to_contain_text("injected")
    shot(page, "5-jobs")
    failed.get_by_role("button", name="Retry").click()
    expect(page.locator(".flash")).to_contain_text("retried")
    expect(page.locator("tr.job[data-status='FAILED']")).to_have_count(0)
    expect(page.locator("tr.job[data-status='PENDING']")).to_have_count(1)
    shot(page, "6-job-retried")

    # Suspensions: live progress.
    page.get_by_role("link", name="Suspensions").click()
    row = page.locator("tr.suspension[data-symbol='BTC-USDT']")
    expect(row.locator(".summary")).to_have_text(re.compile(r"suspension in progress \(\d+ / 8\)"))
    expect(page.locator("meta[http-equiv='refresh']")).to_have_count(1)
    shot(page, "7-suspensions")

    # Audit status.
    page.get_by_role("link", name="Audit").click()
    status = page.locator("#audit-status")
    expect(status).to_be_visible()
    print("audit:", status.inner_text())
    shot(page, "8-audit")

    browser.close()
print("console walk-through passed")
