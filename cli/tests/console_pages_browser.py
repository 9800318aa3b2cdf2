"""Every console page in Debian's chromium (playwright, system browser): accessible, usable by
keyboard, readable at 390 px, and the overview's charts read from the tables of numbers beside
them.

Usage: console_pages_browser.py BASE_URL OUTPUT_DIR CHROMIUM_PATH AXE_SCRIPT IDS_JSON
Called by console_pages_browser.rs, which starts the OpenID provider, `paybus serve` and a real
`paybus run` that works real traffic (some of it failing), stops it, and passes the ids of what
the pages show (IDS_JSON: {"withdrawal": 3, ...}). Afterwards it compares the charts' numbers,
which this script writes to OUTPUT_DIR/charts.json, with what SQL counts.

On every page of PAGES, at each of WIDTHS: axe-core (AXE_SCRIPT, injected into the page) finds
no violation of impact serious or critical; the page does not scroll sideways as a whole; Tab
reaches every enabled button, and each element Tab focuses shows a focus outline at least 2 px
wide (WCAG 2.4.13's thickness). On the overview: the first Tab reaches the skip link, the next
ones the navigation's links in order and then the search box, where Enter searches; the skip
link moves the keyboard into the page's main content. Every problem of every page is listed
before the script fails. Screenshots land in OUTPUT_DIR, one per page and width.
"""

import json
import sys
from urllib.parse import quote

from console_sign_in import sign_in
from playwright.sync_api import expect, sync_playwright

base, out, chromium, axe_script, ids_json = sys.argv[1:6]
ids = {name: quote(str(value), safe="") for name, value in json.loads(ids_json).items()}

# Every console page the checks visit: (name, path with {ids}, signed in). One line a page.
# The ids the test passes: withdrawal, tx_hash, deposit, deposit_order, bonus_job, letter,
# group_function, group_reason, operation, partner (the partner whose endpoint fails), several.
PAGES = [
    ("login", "/console/login", False),
    ("overview", "/console/overview", True),
    ("overview-day", "/console/overview?window=day", True),
    ("search", "/console/search", True),
    ("search-results", "/console/search?q={several}", True),
    ("search-no-result", "/console/search?q=0xnothing-has-this-hash", True),
    ("dead-letters", "/console/dead-letters", True),
    (
        "dead-letter-group",
        "/console/dead-letters/group?function={group_function}&reason={group_reason}",
        True,
    ),
    ("dead-letter", "/console/dead-letters/letter/{letter}", True),
    ("operation", "/console/operations/{operation}", True),
    ("trace", "/console/trace", True),
    ("trace-withdrawal", "/console/trace?kind=withdrawal&id={withdrawal}", True),
    ("trace-deposit", "/console/trace?kind=deposit&id={deposit}", True),
    ("trace-deposit-order", "/console/trace?kind=deposit-order&id={deposit_order}", True),
    ("trace-bonus-job", "/console/trace?kind=bonus-job&id={bonus_job}", True),
    ("trace-not-found", "/console/trace?kind=withdrawal&id=987654321", True),
    ("approvals", "/console/approvals", True),
    ("jobs", "/console/jobs", True),
    ("suspensions", "/console/suspensions", True),
    ("audit", "/console/audit", True),
    ("sessions", "/console/sessions", True),
    ("partners", "/console/partners", True),
    ("partner", "/console/partners/{partner}", True),
    ("error", "/console/dead-letters/letter/987654321", True),
]
WIDTHS = (1280, 390)
# What fails the test; the other impacts (moderate, minor) are listed in axe.json.
FAILING_IMPACTS = ("serious", "critical")
# WCAG 2.4.13 (focus appearance): an indicator at least 2 CSS px thick.
MIN_OUTLINE_PX = 2

problems = []


def new_page(browser, width):
    """A browser context of its own (its own cookies), `width` px wide."""
    context = browser.new_context(viewport={"width": width, "height": 844 if width < 600 else 800})
    page = context.new_page()
    page.set_default_timeout(10_000)
    return context, page


def shot(page, name):
    page.screenshot(path=f"{out}/{name}.png", full_page=True)


# The focused element as the checks need it; `data-tab-target` marks what Tab must reach.
FOCUSED = """() => {
  const e = document.activeElement;
  if (!e || e === document.body) return null;
  const style = getComputedStyle(e);
  return {
    tag: e.tagName.toLowerCase(), type: e.getAttribute('type'), id: e.id,
    href: e.getAttribute('href'), text: (e.innerText || e.value || '').trim().slice(0, 60),
    target: e.dataset.tabTarget ?? null, in_main: !!e.closest('main'),
    outline_style: style.outlineStyle, outline_width: parseFloat(style.outlineWidth) || 0,
  };
}"""


def tab(page):
    page.keyboard.press("Tab")
    return page.evaluate(FOCUSED)


def describe(focused):
    if focused is None:
        return "nothing"
    return f"<{focused['tag']}> {focused['text'] or focused['href'] or focused['id']!r}"


def every_button_is_reached_by_tab(page, where):
    """Tab from the top of the page until every enabled button was focused once; each focused
    element must show its focus."""
    targets = page.evaluate(
        """() => {
          const buttons = [...document.querySelectorAll('button, input[type=submit]')]
            .filter(b => !b.disabled && b.getClientRects().length > 0);
          buttons.forEach((b, i) => { b.dataset.tabTarget = String(i); });
          return buttons.map(b => (b.innerText || b.value || b.ariaLabel || '').trim());
        }"""
    )
    stops = page.evaluate(
        "document.querySelectorAll("
        "'a[href], button, input, select, textarea, summary, [tabindex]').length"
    )
    page.evaluate("document.activeElement && document.activeElement.blur()")
    reached = set()
    unseen = []
    for _ in range(stops + 3):
        focused = tab(page)
        if focused is None:
            break
        if focused["target"] is not None:
            reached.add(int(focused["target"]))
        if focused["outline_style"] == "none" or focused["outline_width"] < MIN_OUTLINE_PX:
            outline = f"{focused['outline_style']} {focused['outline_width']} px"
            unseen.append(f"{describe(focused)} ({outline})")
        if len(reached) == len(targets):
            break
    if unseen:
        problems.append(
            f"{where}: {len(unseen)} focused element(s) show no {MIN_OUTLINE_PX} px focus outline: "
            + ", ".join(unseen[:4])
        )
    for i, name in enumerate(targets):
        if i not in reached:
            problems.append(f"{where}: Tab never reaches the button {name!r}")
    return len(targets)


def no_sideways_scroll(page, where):
    """The page as a whole fits the window's width; what is wider scrolls inside its own box."""
    wide = page.evaluate(
        """() => {
          const width = window.innerWidth;
          if (document.documentElement.scrollWidth <= width) return null;
          const scrolls = e => { for (let p = e.parentElement; p; p = p.parentElement) {
              const x = getComputedStyle(p).overflowX;
              if (x === 'auto' || x === 'scroll' || x === 'hidden') return true; } return false; };
          const over = [...document.body.querySelectorAll('*')]
            .filter(e => e.getBoundingClientRect().right > width + 1 && !scrolls(e))
            .slice(0, 5)
            .map(e => e.tagName.toLowerCase() + (e.id ? '#' + e.id : '')
                      + [...e.classList].map(c => '.' + c).join(''));
          return {scroll_width: document.documentElement.scrollWidth, width, over};
        }"""
    )
    if wide:
        problems.append(
            f"{where}: the page scrolls sideways ({wide['scroll_width']} px in "
            f"{wide['width']} px); too wide: {', '.join(wide['over'])}"
        )


axe_report = []


def axe(page, where):
    """axe-core on the whole page: violations of a failing impact are problems."""
    page.add_script_tag(path=axe_script)
    results = page.evaluate("axe.run(document, {resultTypes: ['violations']})")
    for violation in results["violations"]:
        targets = [" ".join(map(str, node["target"])) for node in violation["nodes"]]
        axe_report.append(
            {
                "page": where,
                "rule": violation["id"],
                "impact": violation["impact"],
                "targets": targets,
            }
        )
        if violation["impact"] in FAILING_IMPACTS:
            problems.append(
                f"{where}: axe {violation['id']} ({violation['impact']}): {violation['help']} — "
                + " | ".join(targets[:5])
            )


def read_charts(page):
    """Each chart's table of numbers as the page has it: its series and, per row, the bucket's
    start (the row header's datetime) and each series' cell."""
    return page.evaluate(
        """() => ({
          window: document.querySelector('#activity').dataset.window,
          charts: [...document.querySelectorAll('table.chart-numbers')].map(t => ({
            chart: t.dataset.chart,
            series: [...t.tHead.rows[0].cells].slice(1).map(c => c.textContent.trim()),
            rows: [...t.tBodies[0].rows].map(r => ({
              at: r.cells[0].querySelector('time').getAttribute('datetime'),
              values: [...r.cells].slice(1).map(c => c.textContent.trim()),
            })),
          })),
        })"""
    )


def keyboard_walk(page):
    """The overview by keyboard alone: skip link, navigation, search box, Enter searches."""
    page.goto(f"{base}/console/overview")
    focused = tab(page)
    if not focused or focused["href"] != "#main":
        problems.append(f"keyboard: the first Tab reaches {describe(focused)}, not the skip link")
    nav = page.locator("header nav a").evaluate_all(
        "links => links.map(a => a.getAttribute('href'))"
    )
    if not nav:
        problems.append("keyboard: the header has no navigation links (header nav a)")
    for href in nav:
        focused = tab(page)
        if not focused or focused["href"] != href:
            problems.append(
                f"keyboard: Tab reaches {describe(focused)} where the navigation's {href} was due"
            )
    focused = tab(page)
    if not focused or focused["type"] != "search":
        problems.append(
            f"keyboard: after the navigation Tab reaches {describe(focused)}, not the search box"
        )
    else:
        page.keyboard.type(json.loads(ids_json)["tx_hash"])
        page.keyboard.press("Enter")
        expect(page).to_have_url(f"{base}/console/trace?kind=withdrawal&id={ids['withdrawal']}")
        shot(page, "keyboard-search-landed")
    # The skip link: Enter on it, and the next Tab is inside the main content.
    page.goto(f"{base}/console/overview")
    focused = tab(page)
    if focused and focused["href"] == "#main":
        page.keyboard.press("Enter")
        expect(page).to_have_url(f"{base}/console/overview#main")
        focused = tab(page)
        if not focused or not focused["in_main"]:
            problems.append(
                f"keyboard: after the skip link Tab reaches {describe(focused)}, outside main"
            )


with sync_playwright() as playwright:
    browser = playwright.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
    signed_out = {width: new_page(browser, width)[1] for width in WIDTHS}
    signed_in = {}
    for width in WIDTHS:
        _, page = new_page(browser, width)
        sign_in(page, base, "alice")
        expect(page.locator("header .who")).to_contain_text("alice@example.com (ADMIN)")
        signed_in[width] = page

    # The charts, as the overview's tables give them, in both windows.
    page = signed_in[1280]
    charts = {}
    for window in ("hour", "day"):
        page.goto(f"{base}/console/overview?window={window}")
        charts[window] = read_charts(page)
        page.locator("#activity details summary").first.click()
        shot(page, f"charts-{window}")
    with open(f"{out}/charts.json", "w") as file:
        json.dump(charts, file, indent=1)

    keyboard_walk(signed_in[1280])

    for name, path, needs_session in PAGES:
        for width in WIDTHS:
            page = (signed_in if needs_session else signed_out)[width]
            where = f"{name} at {width} px"
            page.goto(base + path.format(**ids))
            shot(page, f"{name}-{width}")
            if width < 600:
                no_sideways_scroll(page, where)
            axe(page, where)
            buttons = every_button_is_reached_by_tab(page, where)
            print(f"{where}: {page.title()!r}, {buttons} button(s)")

    with open(f"{out}/axe.json", "w") as file:
        json.dump(axe_report, file, indent=1)
    browser.close()

if problems:
    print(f"{len(problems)} problem(s):")
    for problem in problems:
        print(" -", problem)
    sys.exit(1)
print(f"every page passed at {', '.join(map(str, WIDTHS))} px")
