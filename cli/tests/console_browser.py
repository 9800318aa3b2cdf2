"""Drives the paybus console in Debian's chromium (playwright, system browser).

Usage: console_browser.py BASE_URL SCREENSHOT_DIR CHROMIUM_PATH SAFE_LETTER_ID
Called by console_browser.rs, which starts the OpenID provider and `paybus serve`, seeds the
rows (three letters in the confirm-withdrawal group, one of them safe to replay) and checks the
database afterwards. People sign in on the provider's own pages: carol (no paybus role) is
refused; alice and bob are ADMINs, each in a browser context of their own. Four-eyes is on: the
replay is requested by alice and approved and run by bob; bob's retry of a bonus job is
approved and executed by alice.
"""

import re
import sys

from console_sign_in import sign_in as sign_in_at_provider
from playwright.sync_api import expect, sync_playwright

base, shots, chromium, safe = sys.argv[1:5]


def shot(page, name):
    page.screenshot(path=f"{shots}/{name}.png", full_page=True)


def new_page(browser):
    """A browser context of its own (its own cookies: a person at their own machine)."""
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    page = context.new_page()
    page.set_default_timeout(10_000)
    return context, page


def sign_in(page, user, screenshot=None):
    """From the console's login page, on the provider's own login and consent pages."""
    before_submit = (lambda provider_page: shot(provider_page, screenshot)) if screenshot else None
    sign_in_at_provider(page, base, user, before_submit)


with sync_playwright() as playwright:
    browser = playwright.chromium.launch(executable_path=chromium, args=["--no-sandbox"])

    # Carol signs in at the provider, but none of her groups is a paybus role: refused.
    carol_context, page = new_page(browser)
    sign_in(page, "carol")
    expect(page.locator("p.flash.error")).to_contain_text("your account has no paybus role")
    shot(page, "00-refused")
    page.goto(f"{base}/console/overview")
    expect(page).to_have_url(re.compile(r"/console/login$"))
    carol_context.close()

    # Alice: the login page offers the provider (break-glass is off: no token form).
    alice_context, page = new_page(browser)
    page.goto(f"{base}/console")
    expect(page).to_have_url(re.compile(r"/console/login$"))
    expect(page.locator("#token")).to_have_count(0)
    shot(page, "01-login")
    sign_in(page, "alice", screenshot="01-provider-login")
    expect(page.locator("header .who")).to_contain_text("alice@example.com (ADMIN)")

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

    # Bob, in a browser of his own, signs in, opens the operation, approves what it shows, and
    # runs it: only the safe letter is re-sent; each letter's result is shown.
    alice_page = page
    bob_context, page = new_page(browser)
    sign_in(page, "bob")
    expect(page.locator("header .who")).to_contain_text("bob@example.com (ADMIN)")
    page.goto(operation_url)
    flash = page.locator("p.flash[role=status]")
    operation = page.locator("#operation")
    page.get_by_role("button", name="Approve").click()
    expect(flash).to_contain_text("Approved by bob@example.com")
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
    expect(page.locator("#trail")).to_contain_text("bob@example.com")
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
    # Four-eyes: the retry (asked by bob) waits; alice, still signed in in her browser,
    # approves it on the Approvals page and executes it.
    failed.get_by_role("button", name="Retry").click()
    expect(page.locator(".flash")).to_contain_text("waits for a second ADMIN's approval")
    expect(page.locator("tr.job[data-status='FAILED']")).to_have_count(1)
    page = alice_page
    page.get_by_role("link", name="Approvals").click()
    waiting = page.locator("tr.approval[data-status='AWAITING_APPROVAL']")
    expect(waiting).to_have_count(1)
    expect(waiting).to_contain_text("bob@example.com")
    waiting.get_by_role("button", name="Approve").click()
    expect(page.locator(".flash")).to_contain_text("Approved by alice@example.com")
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

    # Who is signed in: alice and bob, by issuer and subject; alice's own session marked.
    page.get_by_role("link", name="Sessions").click()
    rows = page.locator("#sessions tr.session")
    expect(rows).to_have_count(2)
    expect(page.locator("#sessions tr.session[data-subject='alice']")).to_contain_text(
        "this session"
    )
    expect(page.locator("#sessions tr.session[data-subject='bob']")).to_contain_text(
        "bob@example.com"
    )
    shot(page, "13-sessions")

    # Alice signs out, here and at the provider (its own confirmation page), and lands on the
    # login page. Her old cookie, put back into a fresh browser, opens nothing.
    old_cookies = [c for c in alice_context.cookies() if c["name"] == "paybus_console"]
    assert len(old_cookies) == 1, old_cookies
    page.get_by_role("button", name="Sign out").click()
    page.get_by_role("button", name="Yes, sign me out").click()
    expect(page).to_have_url(re.compile(r"/console/login$"))
    shot(page, "14-signed-out")
    thief_context, page = new_page(browser)
    thief_context.add_cookies(old_cookies)
    page.goto(f"{base}/console/overview")
    expect(page).to_have_url(re.compile(r"/console/login\?session=over$"))
    expect(page.locator("p.flash.warn[role=status]").first).to_contain_text("Your session is over")
    shot(page, "15-old-cookie")

    browser.close()
print("console walk-through passed")
