"""Drives the paybus console in Debian's chromium (playwright, system browser).

Usage: console_browser.py BASE_URL ADMIN_TOKEN SCREENSHOT_DIR CHROMIUM_PATH SAFE_LETTER_ID
Called by console_browser.rs, which seeds the rows (three letters in the confirm-withdrawal
group, one of them safe to replay) and checks the database afterwards.
"""

import re
import sys

from playwright.sync_api import expect, sync_playwright

base, token, shots, chromium, safe = sys.argv[1:6]


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
    shot(page, "01-login")
    page.get_by_role("button", name="Log in").click()

    # Dead letters, grouped: the biggest group first, with the money it holds up.
    expect(page).to_have_url(re.compile(r"/console/dead-letters$"))
    groups = page.locator("tr.group")
    expect(groups).to_have_count(2)
    expect(groups.first).to_have_attribute("data-function", "confirm-withdrawal")
    expect(groups.first.locator("td.letters")).to_have_text("3")
    expect(groups.first).to_contain_text("100 USDT")
    shot(page, "02-dead-letters")

    # Dry run: each letter's verdict. The safe one names a withdrawal still in flight; the two
    # others have unreadable bodies and need a human. Nothing is sent.
    groups.first.get_by_role("button", name="Dry run").click()
    flash = page.locator("p.flash[role=status]")
    expect(flash).to_contain_text("Dry run of group confirm-withdrawal / rejected: 3 letter(s)")
    expect(flash).to_contain_text("safe: 1")
    expect(flash).to_contain_text("needs_human: 2")
    verdicts = page.locator("#letter-verdicts tr.verdict")
    expect(verdicts).to_have_count(3)
    safe_row = page.locator(f"#letter-verdicts tr[data-letter-id='{safe}']")
    expect(safe_row).to_have_attribute("data-verdict", "safe")
    expect(safe_row).to_contain_text("BROADCASTING")
    expect(page.locator("#letter-verdicts tr[data-verdict='needs_human']")).to_have_count(2)
    shot(page, "03-dry-run")

    # Replay: only the safe letter is re-sent; each letter's result is shown.
    page.locator("tr.group").first.get_by_role("button", name="Replay safe ones").click()
    expect(flash).to_contain_text("Replay of group confirm-withdrawal / rejected: replayed: 1")
    results = page.locator("#letter-results tr.result")
    expect(results).to_have_count(3)
    replayed = page.locator(f"#letter-results tr[data-letter-id='{safe}']")
    expect(replayed).to_have_attribute("data-result", "REPLAYED")
    expect(replayed).to_have_attribute("data-verdict", "safe")
    expect(page.locator("#letter-results tr[data-result='NOT_SENT']")).to_have_count(2)
    expect(page.locator("tr.group").first.locator("td.letters")).to_have_text("2")
    shot(page, "04-replay")

    # Replay again: the replayed letter is no longer waiting, the others still need a human.
    page.locator("tr.group").first.get_by_role("button", name="Replay safe ones").click()
    expect(flash).to_contain_text("replayed: 0")
    expect(page.locator("#letter-results tr.result")).to_have_count(2)
    expect(page.locator("#letter-results tr[data-result='NOT_SENT']")).to_have_count(2)
    expect(page.locator(f"#letter-results tr[data-letter-id='{safe}']")).to_have_count(0)
    shot(page, "05-replay-again")

    # Drill down into the group: the letters still waiting.
    page.get_by_role("link", name="confirm-withdrawal").click()
    expect(page.locator("tbody tr")).to_have_count(2)
    expect(page.locator("body")).to_contain_text("withdrawal 9001 not found")
    shot(page, "06-group")

    # Bonus jobs: the FAILED one, retried.
    page.get_by_role("link", name="Bonus jobs").click()
    failed = page.locator("tr.job[data-status='FAILED']")
    expect(failed).to_have_count(1)
    expect(failed).to_contain_text("injected")
    shot(page, "07-jobs")
    failed.get_by_role("button", name="Retry").click()
    expect(page.locator(".flash")).to_contain_text("retried")
    expect(page.locator("tr.job[data-status='FAILED']")).to_have_count(0)
    expect(page.locator("tr.job[data-status='PENDING']")).to_have_count(1)
    shot(page, "08-job-retried")

    # Suspensions: live progress.
    page.get_by_role("link", name="Suspensions").click()
    row = page.locator("tr.suspension[data-symbol='BTC-USDT']")
    expect(row.locator(".summary")).to_have_text(re.compile(r"suspension in progress \(\d+ / 8\)"))
    expect(page.locator("meta[http-equiv='refresh']")).to_have_count(1)
    shot(page, "09-suspensions")

    # Audit status: the continuous auditor's latest pass, clean.
    page.get_by_role("link", name="Audit").click()
    status = page.locator("#audit-status")
    expect(status).to_be_visible()
    expect(status).to_have_attribute("data-clean", "true")
    expect(page.locator("#last-pass")).to_contain_text("checks")
    print("audit:", status.inner_text())
    shot(page, "10-audit")

    browser.close()
print("console walk-through passed")
