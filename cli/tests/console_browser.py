"""Drives the paybus console in Debian's chromium (playwright, system browser).

Usage: console_browser.py BASE_URL ADMIN_TOKEN SCREENSHOT_DIR CHROMIUM_PATH SAFE_LETTER_ID
                          SECOND_ADMIN_TOKEN
Called by console_browser.rs, which seeds the rows (three letters in the confirm-withdrawal
group, one of them safe to replay) and checks the database afterwards. Four-eyes is on: the
replay is requested by the first ADMIN and approved and run by the second.
"""

import re
import sys

from playwright.sync_api import expect, sync_playwright

base, token, shots, chromium, safe, second_token = sys.argv[1:7]


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

    def log_in_as(another_token):
        page.get_by_role("button", name="Log out").click()
        page.goto(f"{base}/console/login")
        page.fill("#token", another_token)
        page.get_by_role("button", name="Log in").click()

    # The overview first: every function consuming, the dead letters waiting, the auditor.
    expect(page).to_have_url(re.compile(r"/console/overview$"))
    expect(page.locator("tr.function[data-function='confirm-withdrawal']")).to_have_attribute(
        "data-paused", "false"
    )
    expect(
        page.locator("tr.function[data-function='confirm-withdrawal'] td.dead-letters")
    ).to_have_text("3")
    expect(page.locator("#auditor")).to_have_attribute("data-violations", "0")
    # Pause a function from here (grant-bonus: nothing in this walk needs it), then resume it.
    grant = page.locator("tr.function[data-function='grant-bonus']").first
    grant.get_by_label("why pause grant-bonus").fill("walk-through")
    grant.get_by_role("button", name="Pause").click()
    expect(page.locator("p.flash[role=status]")).to_contain_text("grant-bonus paused")
    expect(page.locator("tr.function[data-function='grant-bonus']").first).to_have_attribute(
        "data-paused", "true"
    )
    expect(page.locator("tr.function[data-function='grant-bonus']").first).to_contain_text(
        "walk-through"
    )
    shot(page, "02-overview-paused")
    page.locator("tr.function[data-function='grant-bonus']").first.get_by_role(
        "button", name="Resume"
    ).click()
    expect(page.locator("tr.function[data-function='grant-bonus']").first).to_have_attribute(
        "data-paused", "false"
    )

    # Dead letters, grouped: the biggest group first, with the money it holds up.
    page.get_by_role("link", name="Dead letters").click()
    expect(page).to_have_url(re.compile(r"/console/dead-letters$"))
    groups = page.locator("tr.group")
    expect(groups).to_have_count(2)
    expect(groups.first).to_have_attribute("data-function", "confirm-withdrawal")
    expect(groups.first.locator("td.letters")).to_have_text("3")
    expect(groups.first).to_contain_text("100 USDT")
    shot(page, "02-dead-letters")

    # Dry run: an operation, each letter's verdict frozen. The safe one names a withdrawal still
    # in flight; the two others have unreadable bodies and need a human. Nothing is sent, and
    # under four-eyes the requester cannot approve it.
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
    operation = page.locator("#operation")
    expect(operation).to_have_attribute("data-status", "AWAITING_APPROVAL")
    expect(page.locator("#awaiting")).to_be_visible()
    expect(page.get_by_role("button", name="Approve")).to_have_count(0)
    expect(page.get_by_role("button", name=re.compile("^Replay the"))).to_have_count(0)
    operation_url = base + page.locator("#permalink").get_attribute("href")
    shot(page, "03-dry-run")

    # A second ADMIN opens the operation, approves what it shows, and runs it: only the safe
    # letter is re-sent; each letter's result is shown.
    log_in_as(second_token)
    page.goto(operation_url)
    page.get_by_role("button", name="Approve").click()
    expect(flash).to_contain_text("Approved by second-admin")
    expect(operation).to_have_attribute("data-status", "READY")
    shot(page, "04-approved")
    page.get_by_role("button", name="Replay the 1 safe letter(s)").click()
    expect(flash).to_contain_text("Executed: replayed: 1")
    expect(operation).to_have_attribute("data-status", "DONE")
    replayed = page.locator(f"#letter-verdicts tr[data-letter-id='{safe}']")
    expect(replayed).to_have_attribute("data-result", "REPLAYED")
    expect(page.locator("#letter-verdicts tr[data-result='NOT_SENT']")).to_have_count(2)
    shot(page, "05-replay")

    # The letter's own page: replayed, the row it refers to, its trail naming the operation.
    replayed.get_by_role("link", name=safe).click()
    expect(page.locator("#letter")).to_have_attribute("data-status", "REPLAYED")
    expect(page.locator("#trail")).to_contain_text("second-admin")
    expect(page.locator("#trail a")).to_have_count(1)
    shot(page, "06-letter")

    page.get_by_role("link", name="Dead letters").click()
    expect(page.locator("tr.group").first.locator("td.letters")).to_have_text("2")

    # Replay the group again: the button shows the operation first — the replayed letter is no
    # longer waiting, the two others still need a human, so there is nothing to confirm.
    page.locator("tr.group").first.get_by_role("button", name="Replay safe ones").click()
    expect(flash).to_contain_text("safe: 0")
    expect(page.locator("#letter-verdicts tr.verdict")).to_have_count(2)
    expect(page.locator("#letter-verdicts tr[data-verdict='needs_human']")).to_have_count(2)
    expect(page.locator(f"#letter-verdicts tr[data-letter-id='{safe}']")).to_have_count(0)
    expect(page.get_by_role("button", name="Nothing is safe to replay")).to_be_disabled()
    shot(page, "07-replay-again")
    page.get_by_role("link", name="← all groups").click()

    # Drill down into the group: the letters still waiting.
    page.get_by_role("link", name="confirm-withdrawal").click()
    expect(page.locator("tbody tr")).to_have_count(2)
    expect(page.locator("body")).to_contain_text("withdrawal 9001 not found")
    shot(page, "08-group")

    # Bonus jobs: the FAILED one, retried.
    page.get_by_role("link", name="Bonus jobs").click()
    failed = page.locator("tr.job[data-status='FAILED']")
    expect(failed).to_have_count(1)
    expect(failed).to_contain_text("injected")
    shot(page, "09-jobs")
    # Four-eyes: the retry (asked by the second ADMIN, still logged in) waits; the first one
    # approves it on the Approvals page and executes it.
    failed.get_by_role("button", name="Retry").click()
    expect(page.locator(".flash")).to_contain_text("waits for a second ADMIN's approval")
    expect(page.locator("tr.job[data-status='FAILED']")).to_have_count(1)
    log_in_as(token)
    page.get_by_role("link", name="Approvals").click()
    waiting = page.locator("tr.approval[data-status='AWAITING_APPROVAL']")
    expect(waiting).to_have_count(1)
    expect(waiting).to_contain_text("second-admin")
    waiting.get_by_role("button", name="Approve").click()
    expect(page.locator(".flash")).to_contain_text("Approved by black-box-tests")
    page.locator("tr.approval[data-status='APPROVED']").get_by_role("button", name="Execute").click()
    expect(page.locator(".flash")).to_contain_text("Executed")
    expect(page.locator("tr.approval[data-status='EXECUTED']")).to_have_count(1)
    shot(page, "10-job-approved")
    page.get_by_role("link", name="Bonus jobs").click()
    expect(page.locator("tr.job[data-status='FAILED']")).to_have_count(0)
    expect(page.locator("tr.job[data-status='PENDING']")).to_have_count(1)

    # Suspensions: live progress.
    page.get_by_role("link", name="Suspensions").click()
    row = page.locator("tr.suspension[data-symbol='BTC-USDT']")
    expect(row.locator(".summary")).to_have_text(re.compile(r"suspension in progress \(\d+ / 8\)"))
    expect(page.locator("meta[http-equiv='refresh']")).to_have_count(1)
    shot(page, "11-suspensions")

    # Audit status: the continuous auditor's latest pass, clean.
    page.get_by_role("link", name="Audit").click()
    status = page.locator("#audit-status")
    expect(status).to_be_visible()
    expect(status).to_have_attribute("data-clean", "true")
    expect(page.locator("#last-pass")).to_contain_text("checks")
    print("audit:", status.inner_text())
    shot(page, "12-audit")

    browser.close()
print("console walk-through passed")
