"""The live views on a replica (PostgreSQL cells), where event ids and Event-Seq are opaque
positions rather than numbers: the tasks table, a task's page (its history from the oldest event
kept, then live), a workflow's graph and the queues follow changes made through the API after
the page loaded, without a reload, and the console stays clean.

Every wait has a deadline and waits on a DOM or API state; no test sleeps to synchronise.
"""

import pytest
from selenium.webdriver.common.by import By

from conftest import TIMEOUT, Page, console_problems, submit_named, wait_until


@pytest.fixture
def replica_page(browser, replica):
    """The replica's dashboard; at teardown the console must hold no SEVERE entry."""
    browser.get("about:blank")
    browser.get_log("browser")
    yield Page(browser, replica)
    problems = console_problems(browser.get_log("browser"))
    browser.get("about:blank")
    assert not problems, "console errors:\n" + "\n".join(problems)


def test_with_a_replica_the_tasks_table_and_a_tasks_page_go_live(replica_page, replica):
    page, api = replica_page, replica.api
    before = submit_named(api, "noop", "before-load")
    replica.wait_task(before["id"], lambda t: t["state"] == "succeeded")
    page.open("/tasks")
    page.wait_row_state(before["id"], "succeeded")
    page.wait_live()
    page.driver.execute_script("window.sameDocument = true")

    upload = submit_named(api, "external", "upload")
    page.wait_row_state(upload["id"], "running")
    api("POST", f"/tasks/{upload['id']}/progress", {"fraction": 0.5, "message": "half"})
    wait_until(lambda: page.row(upload["id"]).find_element(By.CSS_SELECTOR, 'div.bar[role="progressbar"]').get_attribute("aria-valuenow") == "50",
               message="the row's bar at 50")

    # The task's page: its history from the oldest event kept (since=0), then what comes.
    page.row(upload["id"]).find_element(By.CSS_SELECTOR, "td.name a").click()
    wait_until(lambda: page.find("h1").text == "upload", message="the task's page")
    wait_until(lambda: any("progress 50% half" in item.text for item in page.find_all("ol.history li")),
               message="the history up to the progress")
    assert page.find_all("ol.history li")[0].text.split(" ", 1)[1].startswith("created (")
    page.wait_live()
    api("POST", f"/tasks/{upload['id']}/complete", {"result": {"bytes": 1024}})
    wait_until(lambda: page.find(".heading .badge").text == "succeeded", message="the badge to read succeeded")
    wait_until(lambda: page.find_all("ol.history li")[-1].text.endswith("succeeded (attempt 1)"), message="the end in the history")
    history = [item.text.split(" ", 1)[1] for item in page.find_all("ol.history li")]
    assert len(history) == len(set(history)), f"an event shown twice: {history}"

    page.go("/tasks")
    page.wait_row_state(upload["id"], "succeeded")
    assert page.driver.execute_script("return window.sameDocument === true"), "the page was reloaded"


def test_with_a_replica_a_workflows_graph_and_the_queues_go_live(replica_page, replica):
    page, api = replica_page, replica.api
    workflow = api("POST", "/workflows", {"name": "ship", "tasks": [
        {"key": "build", "name": "build", "kind": "external", "queue": "ship"},
        {"key": "deploy", "name": "deploy", "kind": "noop", "queue": "ship", "dependencies": ["build"]}]})
    ids = workflow["keys"]
    replica.wait_task(ids["build"], lambda t: t["state"] == "running")
    page.open(f"/workflows/{workflow['id']}")
    wait_until(lambda: page.find("h1").text == "ship", message="the workflow's page")

    def node_class(key):
        return page.find(f'svg.graph a.node[data-id="{ids[key]}"]').get_attribute("class").split()

    assert "state-running" in node_class("build") and "state-pending" in node_class("deploy")
    page.wait_live()
    api("POST", f"/tasks/{ids['build']}/complete", {"result": {}})
    wait_until(lambda: all("state-succeeded" in node_class(key) for key in ids), message="both nodes succeeded")

    page.go("/queues")
    wait_until(lambda: page.find_all('tr[data-queue="ship"]'), message="the ship queue's row")
    page.wait_live()
    api("PATCH", "/queues/ship", {"paused": True})
    wait_until(lambda: page.find('tr[data-queue="ship"] button.pause').text == "Resume", message="the pause made through the API")


FOLLOW = """const [since, done] = arguments;
import('/ui/api.js').then((api) => {
  window.followed = [];
  window.followedStream = api.follow({ types: 'task.created' }, since, (type, data) => window.followed.push(data.task.name));
  done(true);
});"""


def test_with_a_replica_a_view_resuming_from_behind_the_shared_stream_gets_each_event_once(replica_page, replica):
    """What a view listed before the shared stream's position comes from a bounded replay, the
    rest from the stream: each event once, in order, though positions cannot be compared here."""
    page, api = replica_page, replica.api
    page.open("/tasks")
    page.wait_live()
    since = page.driver.execute_async_script(
        "const done = arguments[0]; fetch('/tasks?limit=1').then((r) => done(r.headers.get('Event-Seq')));")
    assert len(since) == 24, f"a replica's Event-Seq is a position: {since!r}"
    earlier = [submit_named(api, "noop", f"earlier-{index}") for index in range(3)]
    for task in earlier:
        page.wait_row_state(task["id"], "succeeded")  # the shared stream is past them
    assert page.driver.execute_async_script(FOLLOW, since)
    later = submit_named(api, "noop", "later")
    page.wait_row_state(later["id"], "succeeded")
    names = ["earlier-0", "earlier-1", "earlier-2", "later"]
    wait_until(lambda: page.driver.execute_script("return window.followed") == names,
               message=f"{names} followed once each, in order")
    page.driver.execute_script("window.followedStream.stop()")


# Holds the page's only thread (so the shared stream reads nothing meanwhile) while it makes
# three tasks, waits for them to succeed and lists (synchronous requests, each with the page's
# deadline), then follows from that list's Event-Seq: ahead of the shared stream's position.
FOLLOW_AHEAD = """const [timeout, done] = arguments;
import('/ui/api.js').then((api) => {
  const send = (method, path, body) => {
    const request = new XMLHttpRequest();
    request.open(method, path, false);
    request.setRequestHeader('Content-Type', 'application/json');
    request.send(body === undefined ? null : JSON.stringify(body));
    return request;
  };
  const deadline = performance.now() + timeout * 1000;
  const ids = [0, 1, 2].map((index) =>
    JSON.parse(send('POST', '/tasks', { kind: 'noop', name: `had-${index}` }).responseText).id);
  while (!ids.every((id) => JSON.parse(send('GET', `/tasks/${id}`).responseText).state === 'succeeded')) {
    if (performance.now() > deadline) return done('the tasks did not succeed in time');
  }
  const since = send('GET', '/tasks?limit=1').getResponseHeader('Event-Seq');
  window.followed = [];
  window.followedStream = api.follow({ types: 'task.created' }, since, (type, data) => window.followed.push(data.task.name));
  done(since);
});"""


def test_with_a_replica_a_view_listed_ahead_of_the_shared_stream_skips_what_it_had(replica_page, replica):
    """A view that listed after events the shared stream has yet to send does not get those
    again: the server says which they are (a replay from the stream's position to the view's
    list), and the view passes over them as the stream brings them."""
    page, api = replica_page, replica.api
    page.open("/queues")
    page.wait_live()
    since = page.driver.execute_async_script(FOLLOW_AHEAD, TIMEOUT)
    assert len(since) == 24, since
    later = submit_named(api, "noop", "later")
    replica.wait_task(later["id"], lambda t: t["state"] == "succeeded")
    wait_until(lambda: page.driver.execute_script("return window.followed") == ["later"],
               message="only the task made after the view's list")
    page.driver.execute_script("window.followedStream.stop()")
