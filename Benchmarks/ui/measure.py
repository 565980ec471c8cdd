"""Dashboard figures in headless Chromium against a running server (see run.sh):
- first contentful paint of /ui, against a reference page from the same server (/ui/icon.svg,
  one file with no script): what the page costs over the browser's own floor;
- time until the first task rows are drawn with 10,000 tasks on the server;
- scrolling all 10,000 loaded rows top to bottom in 200 frames (about 2,200 px a frame): frame
  times and the rows in the document, against a reference table of the same 10,000 rows all in
  the document, scrolled the same way.
Prints one line per figure; medians of `rounds` loads."""
import sys
from statistics import median

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

url, rounds = sys.argv[1], int(sys.argv[2])
options = webdriver.ChromeOptions()
options.binary_location = "/usr/bin/chromium"
for argument in ["--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1400,900"]:
    options.add_argument(argument)
driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)
driver.set_script_timeout(600)
# Marks the moment the first task row enters the document, from the page's own start.
driver.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": """
new MutationObserver((changes, observer) => {
  if (document.querySelector('tr.task')) { performance.mark('first-rows'); observer.disconnect(); }
}).observe(document, {subtree: true, childList: true});"""})

PAINT = """const done = arguments[arguments.length - 1];
const look = () => { const entry = performance.getEntriesByName('first-contentful-paint')[0];
  if (entry) done(entry.startTime); else requestAnimationFrame(look); };
look();"""
FIRST_ROWS = """const done = arguments[arguments.length - 1];
const look = () => { const mark = performance.getEntriesByName('first-rows')[0];
  if (mark) done(mark.startTime); else setTimeout(look, 10); };
look();"""
SCROLL = """const [selector, count] = arguments; const done = arguments[arguments.length - 1];
const box = document.querySelector(selector); box.scrollTop = 0;
const step = (box.scrollHeight - box.clientHeight) / count;
const frames = []; let last = null;
const tick = (now) => { if (last !== null) frames.push(now - last); last = now;
  if (frames.length >= count) { done(frames); return; }
  box.scrollTop += step; requestAnimationFrame(tick); };
requestAnimationFrame(tick);"""
NAIVE_TABLE = """const rows = arguments[0];
const box = document.createElement('div'); box.className = 'scroller naive'; box.style.height = '700px';
const table = document.createElement('table'); table.className = 'tasks'; const body = document.createElement('tbody');
for (const row of rows) { const tr = document.createElement('tr'); tr.className = 'task';
  for (const text of row) { const td = document.createElement('td'); td.textContent = text; tr.append(td); }
  const bar = document.createElement('td'); bar.innerHTML = '<div class="bar"><div class="fill"></div></div>'; tr.append(bar);
  body.append(tr); }
table.append(body); box.append(table); document.body.replaceChildren(box);"""


def paint(path):
    driver.get("about:blank")
    driver.get(url + path)
    if path.endswith(".svg"):
        return driver.execute_script("return performance.getEntriesByType('navigation')[0].duration")
    return driver.execute_async_script(PAINT)


try:
    reference = median([paint("/ui/icon.svg") for _ in range(rounds)])
    page = median([paint("/ui") for _ in range(rounds)])
    print(f"first contentful paint of /ui: {page:.1f} ms (reference page {reference:.1f} ms, ratio {page / reference:.2f})")

    firsts = []
    for _ in range(rounds):
        driver.get("about:blank")
        driver.get(url + "/ui#/tasks")
        firsts.append(driver.execute_async_script(FIRST_ROWS))
    print(f"first task rows drawn with 10,000 tasks on the server: {median(firsts):.1f} ms after navigation")

    driver.get(url + "/ui#/tasks")
    WebDriverWait(driver, 30).until(lambda d: d.find_elements(By.CSS_SELECTOR, "tr.task"))
    # Scroll until every page has loaded.
    WebDriverWait(driver, 120, poll_frequency=0.05).until(lambda d: d.execute_script(
        "const box = document.querySelector('.scroller'); box.scrollTop = box.scrollHeight;"
        "return document.querySelector('.status').textContent.startsWith('10,000 tasks')"))
    frames = driver.execute_async_script(SCROLL, ".scroller", 200)
    in_document = driver.execute_script("return document.querySelectorAll('tr.task').length")
    virtual_median, virtual_p95 = median(frames), sorted(frames)[int(len(frames) * 0.95)]
    print(f"scrolling 10,000 tasks: {in_document} rows in the document; frame median {virtual_median:.1f} ms, "
          f"p95 {virtual_p95:.1f} ms over {len(frames)} frames", flush=True)
    data = driver.execute_script("""return fetch('/tasks?limit=1000').then(r => r.json()).then(j => j.tasks.map(t => [t.name || t.kind, t.id, t.kind, t.queue, t.state]))""")
    driver.execute_script(NAIVE_TABLE, (data * 10)[:10000])
    naive_frames = driver.execute_async_script(SCROLL, ".naive", 200)
    naive_median, naive_p95 = median(naive_frames), sorted(naive_frames)[int(len(naive_frames) * 0.95)]
    print(f"reference, all 10,000 rows in the document: frame median {naive_median:.1f} ms, p95 {naive_p95:.1f} ms "
          f"over {len(naive_frames)} frames (median ratio dashboard/reference {virtual_median / naive_median:.2f})")
finally:
    driver.quit()
