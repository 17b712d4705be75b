#!/usr/bin/env python3
"""test_browser.py: the chat page of `calla serve` (GET /) in a real headless browser.

Debian's chromium and chromium-driver, driven by Selenium (PyPI), against `calla serve` on a
tiny-geometry checkpoint with the real vocabulary (random weights: the text is gibberish, but it
is text) and an API key, on the CPU.  `make browser-test` runs it; by hand:
    python3 tests/test_browser.py --bin build/calla [--screenshots DIR]

What it checks, in the browser: the page asks for the API key and sends it; a reply streams in
(its text is seen growing several times before it ends) with its thinking in a collapsible block
and a footer of TTFT, decode tok/s, prompt and cached tokens; a second turn shows cached prompt
tokens > 0; Shift+Enter is a new line and Enter sends; the stop button aborts a reply mid-stream,
the server logs that request as cancelled and serves the next one; model-style text holding
<script> renders as text (see test_markup_is_text for how, since a random model cannot be made
to write it); the page fits a phone-width screen.  Any JavaScript console error (a CSP violation
included) fails the test.  Screenshots of the page go to --screenshots (docs/ has the committed ones).

Without chromium, chromedriver or selenium the test is skipped with a message, except under
CI=true, where it fails.
"""
import argparse
import json
import os
import re
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_server import FAILURES, RESULTS, Server, check, request  # noqa: E402

KEY = "sk-browser-test"
WAIT = 60   # seconds, for anything the page should do


def in_ci():
    return os.environ.get("CI", "") not in ("", "0", "false")


def missing_tools():
    missing = [name for name in ("chromium", "chromedriver") if not shutil.which(name)]
    try:
        import selenium  # noqa: F401
    except ImportError:
        missing.append("selenium (pip install selenium)")
    return missing


def start_browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    opts = webdriver.ChromeOptions()
    opts.binary_location = shutil.which("chromium")
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1100,820", "--no-first-run", "--disable-extensions", "--lang=en-US"):
        opts.add_argument(arg)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    # The Debian driver, named explicitly: Selenium fetches nothing.
    return webdriver.Chrome(service=Service(executable_path=shutil.which("chromedriver")), options=opts)


class Page:
    """The page in the browser, with the checks every step shares."""

    def __init__(self, driver, url):
        self.d, self.url = driver, url
        self.console = []

    def js(self, script, *args):
        return self.d.execute_script(script, *args)

    def wait(self, what, fn, timeout=WAIT):
        deadline = time.time() + timeout
        while time.time() < deadline:
            v = fn()
            if v:
                return v
            time.sleep(0.05)
        check(f"page: {what} (within {timeout} s)", False)
        return None

    def console_errors(self, step):
        """Fails on any console message of level SEVERE (JavaScript errors, CSP violations, failed loads)."""
        logs = self.d.get_log("browser")
        self.console += logs
        errors = [e for e in logs if e.get("level") == "SEVERE"]
        check(f"no JavaScript console error ({step})", not errors, errors)

    def el(self, css):
        from selenium.webdriver.common.by import By
        return self.d.find_element(By.CSS_SELECTOR, css)

    def replies(self):
        return self.js("return document.querySelectorAll('#log .msg.assistant').length")

    def last_reply(self):
        """-> {text, think, busy, stats, html} of the newest reply."""
        return self.js("""
            const m = [...document.querySelectorAll('#log .msg.assistant')].pop();
            if (!m) return null;
            const t = m.querySelector('.think-body'), s = m.querySelector('.stats');
            return {text: m.querySelector('.body').textContent, think: t ? t.textContent : '',
                    busy: m.getAttribute('aria-busy') === 'true', stats: s ? s.textContent : null,
                    html: m.innerHTML};""")

    def type(self, *keys):
        self.el("#input").send_keys(*keys)

    def settings(self, max_tokens, thinking):
        self.js("document.getElementById('max-tokens').value = arguments[0];"
                "document.getElementById('think').checked = arguments[1];", max_tokens, thinking)

    def send(self, text):
        """Types a message and sends it with Enter, as a keyboard user does. -> the reply's index."""
        from selenium.webdriver.common.keys import Keys
        n = self.replies()
        self.el("#input").click()
        self.type(text, Keys.ENTER)
        self.wait("the message is sent (a reply appears)", lambda: self.replies() > n, 10)
        return n

    def finished(self):
        return self.wait("the reply finishes (its footer appears)",
                         lambda: (lambda r: r if r and r["stats"] is not None else None)(self.last_reply()))


def stats_of(footer):
    """The footer's numbers: {ttft, tps, prompt, cached}."""
    out = {}
    for key, pattern in (("ttft", r"TTFT (\d+) ms"), ("tps", r"([\d.]+) tok/s"), ("prompt", r"prompt (\d+) tokens"),
                         ("cached", r"cached (\d+)")):
        m = re.search(pattern, footer or "")
        out[key] = float(m.group(1)) if m else None
    return out


def test_key(page, model_name):
    from selenium.webdriver.common.keys import Keys
    page.d.get(page.url)
    page.wait("the page asks for the API key", lambda: page.el("#key-form").is_displayed(), 15)
    check("page: the key field has the focus", page.js("return document.activeElement.id") == "key")
    page.el("#key").send_keys(KEY, Keys.ENTER)
    page.wait("the key is accepted (the model's name shows)",
              lambda: page.el("#model").text == model_name, 15)
    check("page: key form hidden once the key works", not page.el("#key-form").is_displayed())
    page.console_errors("load and key")


def test_keyboard(page):
    from selenium.webdriver.common.keys import Keys
    page.el("#input").click()
    page.type("line one", Keys.SHIFT, Keys.ENTER, Keys.SHIFT, "line two")
    value = page.js("return document.getElementById('input').value")
    check("keyboard: Shift+Enter is a new line, not a send", value == "line one\nline two" and page.replies() == 0,
          repr(value))
    page.js("document.getElementById('input').value = ''")


def test_streaming(page, srv):
    """Turn 1 (thinking on) streams incrementally; turn 2 (thinking off) shows cached tokens."""
    page.settings(96, True)
    page.send("Hello! Please think about the sea, then answer.")
    lengths, t_end = [], time.time() + WAIT
    while time.time() < t_end:   # what a reader sees while the reply is being written
        r = page.last_reply()
        if r and not r["busy"]:
            break
        if r:
            lengths.append(len(r["text"]) + len(r["think"]))
        time.sleep(0.03)
    r = page.finished()
    partial = sorted({n for n in lengths if n > 0})
    final = len(r["text"]) + len(r["think"]) if r else 0
    check("streaming: the reply was seen growing (>= 3 different partial lengths before the end)",
          len(partial) >= 3 and partial[0] < final, (partial[:20], final))
    check("streaming: thinking shown in a collapsible block", r and len(r["think"]) > 0
          and page.js("return !!document.querySelector('#log .msg.assistant details.think > summary')"), r)
    page.el("#log .msg.assistant details.think > summary").click()
    opened = page.js("return document.querySelector('#log .msg.assistant details.think').open")
    page.el("#log .msg.assistant details.think > summary").click()
    check("streaming: the thinking block opens and closes",
          page.js("return document.querySelector('#log .msg.assistant details.think').open") != opened)
    s1 = stats_of(r["stats"] if r else "")
    check("footer: TTFT, decode tok/s, prompt tokens and cached tokens shown",
          all(s1[k] is not None for k in ("ttft", "tps", "prompt", "cached")) and s1["prompt"] > 0, r and r["stats"])
    page.console_errors("first turn")

    page.settings(48, False)
    page.send("Thanks. Now answer in one line, without thinking.")
    r = page.finished()
    s2 = stats_of(r["stats"] if r else "")
    check("second turn: cached prompt tokens > 0 in the footer", (s2["cached"] or 0) > 0, r and r["stats"])
    check("second turn: the answer is content (no thinking block)", r and len(r["text"]) > 0 and not r["think"], r)
    check("second turn: prompt tokens grew", (s2["prompt"] or 0) > (s1["prompt"] or 0), (s1, s2))
    page.console_errors("second turn")


def test_stop(page, srv):
    cancelled_before = srv.text().count("cancelled")
    page.settings(4000, False)   # ~80 s of decoding on the tiny geometry: it is stopped long before
    page.send("Tell me a very long story.")
    page.wait("the long reply starts streaming", lambda: len((page.last_reply() or {}).get("text", "")) > 0, WAIT)
    check("stop: the stop button is enabled while a reply streams", page.el("#stop").is_enabled())
    t0 = time.time()
    page.el("#stop").click()
    r = page.finished()
    check("stop: the reply ends, marked stopped, within 5 s", r and "stopped" in (r["stats"] or "")
          and time.time() - t0 < 5, r and r["stats"])
    check("stop: send enabled again, stop disabled", page.el("#send").is_enabled() and not page.el("#stop").is_enabled())
    page.wait("the server logs the request as cancelled", lambda: srv.text().count("cancelled") > cancelled_before, 15)
    st, _, b = request(srv.port, "GET", "/metrics", headers={"Authorization": "Bearer " + KEY})
    check("stop: calla_cancelled_total counts it", st == 200 and re.search(rb"calla_cancelled_total [1-9]", b), b[-800:])
    page.console_errors("stop")

    page.settings(16, False)
    page.send("Short answer please.")
    r = page.finished()
    check("after a stop the next request is served", r and len(r["text"]) > 0 and "stopped" not in r["stats"]
          and "error" not in r["html"], r)
    page.console_errors("after stop")


def test_markup_is_text(page):
    """A random model cannot be made to write <script>, so the markup goes through the two honest
    paths to the same renderer: (1) typed as a user message, which the page renders with the same
    Markdown function as replies (and sends to the server); (2) given to that function as a reply
    through the page's own addMessage, as if the model had written it."""
    from selenium.common.exceptions import NoAlertPresentException
    page.el("#new").click()
    check("new conversation: the view is empty", page.js("return document.querySelectorAll('#log .msg').length") == 0)
    page.settings(4, False)
    typed = "<script>alert(1)</script> <img src=x onerror=alert(2)> **bold** `<b>code</b>`"
    page.send(typed)
    page.finished()
    user = page.js("const u = document.querySelector('#log .msg.user .body'); return [u.textContent, u.innerHTML]")
    check("markup: a user message holding <script> renders as text",
          "<script>alert(1)</script>" in user[0] and "<img src=x onerror=alert(2)>" in user[0] and "<b>code</b>" in user[0],
          user)
    check("markup: Markdown still applies around it (bold, inline code)", "<strong>bold</strong>" in user[1]
          and "<code>&lt;b&gt;code&lt;/b&gt;</code>" in user[1], user[1])
    reply = ("Here is code:\n```html\n<script>window.__xss = 1</script>\n```\n<script>window.__xss = 2</script>\n"
             "<img src=x onerror=\"window.__xss = 3\"> [click](javascript:window.__xss=4) "
             "[docs](https://example.com/a\"onmouseover=\"window.__xss=5)\n- item <iframe src=/>")
    page.js("window.calla.addMessage({role: 'assistant', content: arguments[0]})", reply)
    found = page.js("""
        const log = document.getElementById('log');
        return {tags: [...log.querySelectorAll('script, img, iframe, [onerror], [onmouseover]')].map(e => e.tagName),
                hrefs: [...log.querySelectorAll('a')].map(a => a.getAttribute('href')),
                text: [...log.querySelectorAll('.msg.assistant')].pop().textContent,
                pre: [...log.querySelectorAll('.msg.assistant pre code')].map(e => e.textContent),
                xss: window.__xss === undefined ? null : window.__xss};""")
    check("markup: a reply holding <script>, <img onerror>, <iframe> creates no such element",
          found["tags"] == [] and found["xss"] is None, found)
    check("markup: it shows as text (and in the code block)", "<script>window.__xss = 2</script>" in found["text"]
          and found["pre"] == ["<script>window.__xss = 1</script>"], found)
    check("markup: no javascript: link; a quote in a URL stays inside its href (no onmouseover above)",
          len(found["hrefs"]) == 1 and found["hrefs"][0].startswith("https://example.com/"), found["hrefs"])
    try:
        alert = page.d.switch_to.alert.text
    except NoAlertPresentException:
        alert = None
    check("markup: no alert fired", alert is None, alert)
    page.console_errors("markup")


def test_phone(page, shots):
    page.d.set_window_size(390, 844)
    time.sleep(0.3)
    geo = page.js("""
        const r = (id) => document.getElementById(id).getBoundingClientRect();
        return {scroll: document.documentElement.scrollWidth, width: window.innerWidth,
                input: r('input').right, send: r('send').right, sendBottom: r('send').bottom, height: window.innerHeight};""")
    check("phone width: no horizontal scrolling; input and send button on screen",
          geo["scroll"] <= geo["width"] and geo["input"] <= geo["width"] and geo["send"] <= geo["width"]
          and geo["sendBottom"] <= geo["height"], geo)
    if shots:
        page.d.save_screenshot(os.path.join(shots, "chat-page-phone.png"))
    page.console_errors("phone width")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--screenshots", help="directory for chat-page.png and chat-page-phone.png")
    a = ap.parse_args()
    missing = missing_tools()
    if missing:
        if in_ci():
            print("FAIL test_browser.py: missing " + ", ".join(missing) + " (CI installs chromium chromium-driver "
                  "and selenium: see .ci/run)", flush=True)
            return 1
        print("SKIP test_browser.py: missing " + ", ".join(missing) + " (apt-get install chromium chromium-driver; "
              "pip install selenium)", flush=True)
        return 0
    vocab = os.path.join(os.path.dirname(os.path.abspath(a.bin)), "tokenizer", "tokenizer.json")
    if not os.path.exists(vocab):   # the synthetic vocabulary decodes random tokens to nothing visible
        print(f"{'FAIL' if in_ci() else 'SKIP'} test_browser.py: {vocab} is missing "
              "(tools/gen/fetch_tokenizer.sh builds it)", flush=True)
        return 1 if in_ci() else 0
    t0 = time.time()
    tmp = tempfile.mkdtemp(prefix="calla_browser_")
    model = os.path.join(tmp, "tiny-chat")
    env = dict(os.environ, CALLA_TOKENIZER_JSON=vocab)
    import subprocess
    subprocess.run([a.bin, "synth", "--geometry", "tiny", "--seed", "1", "--out", model], check=True, env=env,
                   stdout=subprocess.DEVNULL)
    srv = Server(a.bin, model, "--context", 8192, "--threads", 2, "--api-key", KEY)
    driver = page = None
    try:
        url = f"http://127.0.0.1:{srv.port}/"
        st, h, body = request(srv.port, "GET", "/")
        check("GET / without a key: 200, the page, with a strict CSP", st == 200 and b"<textarea" in body
              and h.get("content-type", "").startswith("text/html")
              and "default-src 'self'" in h.get("content-security-policy", ""), (st, h))
        driver = start_browser()
        page = Page(driver, url)
        test_key(page, "tiny-chat")
        test_keyboard(page)
        test_streaming(page, srv)
        test_stop(page, srv)
        if a.screenshots:   # tall enough for the whole conversation
            os.makedirs(a.screenshots, exist_ok=True)
            driver.set_window_size(1100, 1250)
            time.sleep(0.3)
            driver.save_screenshot(os.path.join(a.screenshots, "chat-page.png"))
            driver.set_window_size(1100, 820)
        test_markup_is_text(page)
        test_phone(page, a.screenshots)
    except Exception as e:   # a Selenium error is a failed check, with the server's log below
        check("browser session ran to the end", False, f"{type(e).__name__}: {e}")
    finally:
        if driver:
            driver.quit()
        rc = srv.stop()
        log = srv.text()
        check("server: SIGTERM exit 0", rc == 0, log[-2000:])
        if RESULTS["fail"]:
            print("---- server log (tail) ----\n" + log[-4000:], flush=True)
            if page:
                print("---- browser console ----\n" + json.dumps(page.console, indent=1)[-4000:], flush=True)
        os.unlink(srv.log.name)
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"test_browser.py: {RESULTS['ok']} checks ok, {RESULTS['fail']} failed in {time.time() - t0:.0f} s"
          + (" (" + ", ".join(FAILURES) + ")" if FAILURES else ""), flush=True)
    return 1 if RESULTS["fail"] else 0


if __name__ == "__main__":
    sys.exit(main())
