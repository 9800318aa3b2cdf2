"""Signing in to the paybus console on the test OpenID provider's own pages: shared by the
console's browser scripts (console_browser.py, console_pages_browser.py)."""

import re

from playwright.sync_api import expect


def sign_in(page, base, user, before_submit=None):
    """From the console's login page at `base`, on the provider's own login and consent pages.
    `before_submit(page)` runs on the provider's filled-in login page (a screenshot)."""
    page.goto(f"{base}/console")
    expect(page).to_have_url(re.compile(r"/console/login$"))
    page.get_by_role("button", name=re.compile("^Sign in with ")).click()
    # The provider's page, not ours: a login and a password field (any password).
    expect(page).not_to_have_url(re.compile(f"^{re.escape(base)}"))
    page.fill("input[name=login]", user)
    page.fill("input[name=password]", "any")
    if before_submit:
        before_submit(page)
    page.get_by_role("button", name="Sign-in").click()
    page.get_by_role("button", name="Continue").click()
