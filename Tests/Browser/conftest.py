"""Fixtures for the dashboard's browser tests.

Each test gets a fresh `taskloop` (the debug binary, `--port 0 --durability memory`), stopped
with SIGTERM when the test ends; each module gets one headless Chromium (the system's, driven by
the system chromedriver). After every test the browser's console must hold no SEVERE entry.

Run through scripts/check-ui.sh, which installs what is missing and sets TASKLOOP_BIN.
"""

import json
import os
import pathlib
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request

import pytest
from selenium import webdriver
from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By

ROOT = pathlib.Path(__file__).resolve().parents[2]
VENDOR = pathlib.Path(__file__).resolve().parent / "vendor"
CHROMIUM = os.environ.get("TASKLOOP_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("TASKLOOP_CHROMEDRIVER", "/usr/bin/chromedriver")
# Every wait has a deadline; a slow machine can stretch them all.
TIMEOUT = 15 * float(os.environ.get("TASKLOOP_UI_TIMEOUT_SCALE", "1"))
AXE_TAGS = ["wcag2a", "wcag2aa", "wcag21a", "wcag21aa", "best-practice"]


def taskloop_binary():
    path = os.environ.get("TASKLOOP_BIN")
    if path:
        return os.path.abspath(path)
    found = sorted(ROOT.glob(".build/*/debug/taskloop"))
    if not found:
        pytest.exit("no taskloop binary: set TASKLOOP_BIN (scripts/check-ui.sh does)", returncode=2)
    return str(found[0])


# ---------------------------------------------------------------------------------------------
# Waiting


def wait_until(predicate, timeout=None, message=None, interval=0.05):
    """Polls `predicate` until it returns something truthy (which is returned) or the deadline
    passes (AssertionError naming `message` and the last value seen). An element that vanished
    or was replaced meanwhile (the table re-renders) counts as "not yet"."""
    timeout = TIMEOUT if timeout is None else timeout
    deadline = time.monotonic() + timeout
    last = None
    while True:
        try:
            last = predicate()
            if last:
                return last
        except (StaleElementReferenceException, NoSuchElementException) as error:
            last = f"{type(error).__name__}: {error.msg}"
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {message or predicate}; last value: {last!r}")
        time.sleep(interval)


# ---------------------------------------------------------------------------------------------
# The server


class ApiError(Exception):
    def __init__(self, method, path, status, body):
        super().__init__(f"{method} {path}: HTTP {status}: {body[:500]}")
        self.status = status
        self.body = body


class Server:
    """A taskloop process on a free port, and `api(method, path, body)` to talk to it. Its state
    is in memory unless `durability` says otherwise (None: the server's own choice, as a replica
    on --database-url needs)."""

    def __init__(self, *args, token=None, token_flag=True, durability="memory"):
        self.token = token
        command = [taskloop_binary(), "--port", "0", *(["--durability", durability] if durability else []), "--log-level", "warning", *args]
        if token and token_flag:
            command += ["--auth-token", token]
        self.process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd="/")
        self.output = []
        self.url = None
        ready = threading.Event()

        def drain():
            for line in self.process.stdout:
                self.output.append(line)
                match = re.search(r"listening on (http://\S+)", line)
                if match and not ready.is_set():
                    self.url = match.group(1).rstrip("/")
                    ready.set()
            ready.set()

        threading.Thread(target=drain, daemon=True).start()
        if not ready.wait(20) or not self.url:
            self.stop()
            raise RuntimeError("taskloop did not start:\n" + "".join(self.output))

    def api(self, method, path, body=None, token=None):
        """Calls the API; returns the decoded JSON answer (None when empty), raises ApiError for 4xx/5xx."""
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.url + path, data=data, method=method)
        request.add_header("Accept", "application/json")
        if data is not None:
            request.add_header("Content-Type", "application/json")
        token = token or self.token
        if token:
            request.add_header("Authorization", f"Bearer {token}")
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                text = response.read()
        except urllib.error.HTTPError as error:
            raise ApiError(method, path, error.code, error.read().decode(errors="replace")) from None
        return json.loads(text) if text else None

    def task(self, task_id):
        return self.api("GET", f"/tasks/{task_id}")

    def wait_task(self, task_id, predicate, message=None, timeout=None):
        """Waits until the API's view of a task satisfies `predicate`; returns the task."""
        return wait_until(lambda: (lambda task: task if predicate(task) else None)(self.task(task_id)),
                          timeout, message or f"task {task_id} to satisfy {predicate}")

    def event_streams(self):
        """The server's `taskloop_event_streams` metric: event streams open now."""
        request = urllib.request.Request(self.url + "/metrics")
        if self.token:
            request.add_header("Authorization", f"Bearer {self.token}")
        with urllib.request.urlopen(request, timeout=60) as response:
            text = response.read().decode()
        return int(float(re.search(r"^taskloop_event_streams (\S+)$", text, re.MULTILINE).group(1)))

    def stop(self):
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode


@pytest.fixture
def server(request, tmp_path):
    """A fresh server for one test. `@pytest.mark.server(token="...", args=[...])` configures it;
    `tokens=[(token, role), ...]` writes them to an --auth-token-file (the API calls of the test
    use the first)."""
    marker = request.node.get_closest_marker("server")
    options = dict(marker.kwargs) if marker else {}
    args = list(options.get("args", []))
    token = options.get("token")
    token_file = None
    if options.get("tokens"):
        token_file = tmp_path / "tokens"
        token_file.write_text("".join(f"{secret} {role}\n" for secret, role in options["tokens"]))
        args += ["--auth-token-file", str(token_file)]
        token = options["tokens"][0][0]
    instance = Server(*args, token=token, token_flag=token_file is None)
    instance.token_file = token_file
    yield instance
    code = instance.stop()
    assert code == 0, f"taskloop exited with {code}:\n" + "".join(instance.output)


def free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture
def replica():
    """One replica on a throwaway PostgreSQL (its tasks and schedules live in the cells it owns;
    its event ids are positions, not numbers). Skipped where PostgreSQL is not installed."""
    if not any(pathlib.Path("/usr/lib/postgresql").glob("*/bin/initdb")):
        pytest.skip("PostgreSQL is not installed (apt-get install postgresql)")
    script = str(ROOT / "scripts/postgres-cluster.sh")
    # Directly in /tmp: the cluster runs as the postgres user, who cannot enter pytest's tmp_path.
    cluster = pathlib.Path(tempfile.mkdtemp(prefix="taskloop-ui-pg-"))
    url = subprocess.run([script, "start", str(cluster), str(free_port())], check=True, capture_output=True, text=True).stdout.strip()
    try:
        instance = Server("--database-url", url, "--replica-name", "r1", durability=None)
        yield instance
        assert instance.stop() == 0, "".join(instance.output)
    finally:
        subprocess.run([script, "stop", str(cluster)], check=False)
        shutil.rmtree(cluster, ignore_errors=True)


@pytest.fixture
def api(server):
    """`api(method, path, body=None)` against this test's server."""
    return server.api


# ---------------------------------------------------------------------------------------------
# The browser


def chromium():
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1400,900", "--lang=en-US"):
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_script_timeout(60)
    return driver


@pytest.fixture(scope="module")
def browser():
    driver = chromium()
    yield driver
    driver.quit()


def console_problems(entries, allowed_statuses=()):
    """The SEVERE console entries, less the browser's own "Failed to load resource" line for an
    answer whose status the test expects (401 in the auth test, 404 for an unknown id)."""
    problems = []
    for entry in entries:
        if entry["level"] != "SEVERE":
            continue
        message = entry["message"]
        if "Failed to load resource: the server responded with a status of" in message and any(
                f"status of {status} " in message for status in allowed_statuses):
            continue
        problems.append(message)
    return problems


class Page:
    """The dashboard of one test's server in the module's browser."""

    def __init__(self, driver, server):
        self.driver = driver
        self.server = server

    def open(self, route="/tasks"):
        """Loads /ui at `route` (a hash route such as "/tasks?state=failed") and waits for the view."""
        self.driver.get(f"{self.server.url}/ui#{route}")
        self.wait_view()

    def go(self, route):
        """Moves to another hash route in the same page, as a link would, and waits until the
        view it was showing has been replaced (by the new view, or a notice saying why not)."""
        before = self.find_all("#view > *")
        self.driver.execute_script("location.hash = arguments[0]", route)
        wait_until(lambda: (lambda now: now and (not before or now[0] != before[0]))(self.find_all("#view > *")),
                   message=f"the view of #{route}")

    def wait_view(self):
        wait_until(lambda: self.find_all("#view > .view, #view > .notice"), message="a view to be mounted")

    def find(self, css):
        return self.driver.find_element(By.CSS_SELECTOR, css)

    def find_all(self, css):
        return self.driver.find_elements(By.CSS_SELECTOR, css)

    def wait_find(self, css, message=None, timeout=None):
        return wait_until(lambda: (self.find_all(css) or [None])[0], timeout, message or f"{css} to appear")

    def wait_live(self):
        wait_until(lambda: self.find("#connection").text == "Live" and self.find("#connection").get_attribute("data-state") == "live",
                   message="#connection to read Live")

    def hash(self):
        return self.driver.execute_script("return location.hash")

    def row(self, task_id):
        return self.find(f'tr.task[data-id="{task_id}"]')

    def row_ids(self):
        return [row.get_attribute("data-id") for row in self.find_all("tr.task")]

    def wait_row_state(self, task_id, state):
        return wait_until(lambda: self.row(task_id).get_attribute("data-state") == state,
                          message=f"row {task_id} to show {state}")

    def section(self, title):
        """A card of the task page by its heading."""
        return self.driver.find_element(By.XPATH, f"//section[h2[normalize-space()='{title}']]")

    def axe_violations(self, impacts=("serious", "critical")):
        """Runs the vendored axe-core on the current document; returns its violations of the
        given impacts as [{id, impact, help, nodes: [{target, summary}]}]."""
        if not self.driver.execute_script("return typeof window.axe === 'object'"):
            self.driver.execute_script((VENDOR / "axe.min.js").read_text())
        result = self.driver.execute_async_script(
            """
            const [tags, done] = arguments;
            axe.run(document, { runOnly: { type: 'tag', values: tags }, resultTypes: ['violations'] })
              .then((results) => done({ ok: results.violations.map((v) => ({
                  id: v.id, impact: v.impact, help: v.help,
                  nodes: v.nodes.map((n) => ({ target: n.target.join(' '), summary: n.failureSummary })) })) }),
                (error) => done({ error: String(error) }));
            """,
            AXE_TAGS,
        )
        assert "error" not in result, f"axe failed: {result['error']}"
        return [violation for violation in result["ok"] if violation["impact"] in impacts]


@pytest.fixture
def page(browser, server, request):
    """The test's server's dashboard in the module's browser. At teardown the console must hold
    no SEVERE entry (`@pytest.mark.console_allows(401)` lets the browser's lines for 401 answers through)."""
    browser.get("about:blank")
    browser.get_log("browser")  # whatever came before this test
    yield Page(browser, server)
    entries = browser.get_log("browser")
    browser.get("about:blank")  # the page's streams end before the server does
    marker = request.node.get_closest_marker("console_allows")
    problems = console_problems(entries, marker.args if marker else ())
    assert not problems, "console errors:\n" + "\n".join(problems)


def pytest_configure(config):
    config.addinivalue_line("markers", "server(token=None, tokens=None, args=[]): options of the test's taskloop")
    config.addinivalue_line("markers", "console_allows(*statuses): the browser may log its failed loads with these statuses")


def submit_named(api, kind, name, params=None, **fields):
    return api("POST", "/tasks", {"kind": kind, "name": name, "params": params or {}, **fields})


def scene(server, concurrency=10):
    """A running task, a failed one, a paused queue with work waiting, and a workflow with both
    a running and a failed task: every action button of every view has something to act on."""
    api = server.api
    api("PATCH", "/queues/default", {"max_concurrency": concurrency})
    running = submit_named(api, "sleep", "long-sleep", {"duration_ms": 600000})
    failed = submit_named(api, "sleep", "flaky-job", {"duration_ms": 10, "steps": 1, "outcome": "fail"})
    api("PATCH", "/queues/lane", {"paused": True})
    held = submit_named(api, "noop", "held", queue="lane")
    workflow = api("POST", "/workflows", {"name": "pair", "tasks": [
        {"key": "slow", "kind": "sleep", "params": {"duration_ms": 600000}},
        {"key": "bad", "kind": "sleep", "params": {"duration_ms": 10, "steps": 1, "outcome": "fail"}}]})
    server.wait_task(running["id"], lambda t: t["state"] == "running")
    server.wait_task(failed["id"], lambda t: t["state"] == "failed")
    server.wait_task(workflow["keys"]["bad"], lambda t: t["state"] == "failed")
    return {"running": running["id"], "failed": failed["id"], "held": held["id"], "workflow": workflow["id"],
            "workflow_keys": workflow["keys"]}
