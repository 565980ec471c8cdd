"""The dashboard's Schedules view in a real browser: the list follows the API as schedules come,
change and go; a schedule's page pauses, runs now (the run and its state appear in its last
runs, linked both ways with the run's task) and deletes; with replicas, where the API does not
serve schedules, the view says so.

Every wait has a deadline and waits on a DOM or API state; no test sleeps to synchronise.
"""

import pathlib
import shutil
import socket
import subprocess
import tempfile

import pytest
from selenium.webdriver.common.by import By

from conftest import Server, console_problems, wait_until
from test_access import READER, TOKENS, assert_all_refused, enter_token

ROOT = pathlib.Path(__file__).resolve().parents[2]
# New Year at midnight: no slot comes during a test, so every run is one the test made.
YEARLY = "0 0 1 1 *"


def create(api, name, **fields):
    return api("POST", "/schedules", {"name": name, "cron": YEARLY, "task": {"kind": "noop", "queue": "ticks"}, **fields})


def row(page, schedule_id):
    return page.find(f'tr.schedule[data-id="{schedule_id}"]')


def cells(page, schedule_id):
    return [cell.text for cell in row(page, schedule_id).find_elements(By.CSS_SELECTOR, "th, td")]


def test_list_open_pause_trigger_and_delete_a_schedule(page, api, server):
    nightly = create(api, "nightly-report", timezone="Europe/Paris")
    page.open("/schedules")
    wait_until(lambda: page.find_all(f'tr.schedule[data-id="{nightly["id"]}"]'), message="the schedule's row")
    name, cron, timezone, status, next_run, last_run = cells(page, nightly["id"])
    assert (name, cron, timezone, status, last_run) == ("nightly-report", YEARLY, "Europe/Paris", "active", "—")
    assert next_run != "—"
    assert page.find('nav a[data-section="schedules"]').get_attribute("aria-current") == "page"

    # One made meanwhile is listed without a reload, in name order.
    page.wait_live()
    hourly = create(api, "a-hourly-sync", paused=True)
    wait_until(lambda: [r.get_attribute("data-id") for r in page.find_all("tr.schedule")] == [hourly["id"], nightly["id"]],
               message="the new schedule listed first")
    assert cells(page, hourly["id"])[3] == "paused" and cells(page, hourly["id"])[4] == "—"

    row(page, nightly["id"]).find_element(By.LINK_TEXT, "nightly-report").click()
    wait_until(lambda: page.find("#view h1").text == "nightly-report", message="the schedule's page")
    assert len(page.find_all("ol.next-runs li time")) == 5
    assert page.find("table.runs tbody").text == "No runs yet."
    assert not page.axe_violations(), "axe-core objects to the schedule page"

    # Pause: the API and the page both say so, and no next runs are shown.
    pause = page.find("button.pause")
    assert pause.text == "Pause"
    pause.click()
    wait_until(lambda: api("GET", f"/schedules/{nightly['id']}")["paused"] is True, message="the API to show it paused")
    wait_until(lambda: page.find(".heading .badge").get_attribute("data-state") == "paused", message="the badge to read paused")
    wait_until(lambda: pause.text == "Resume", message="the button to read Resume")
    assert page.find("ol.next-runs").text == "None while paused."

    # Run now (paused or not): the run appears with its state, which follows the task to the end.
    page.find("button.trigger").click()
    wait_until(lambda: page.find_all("tr.run"), message="a run in last runs")
    task_id = api("GET", f"/schedules/{nightly['id']}")["last_runs"][-1]["task_id"]
    wait_until(lambda: page.find("tr.run").get_attribute("data-state") == "succeeded", message="the run to show succeeded")
    assert page.find("tr.run .badge").text == "succeeded"
    assert server.task(task_id)["state"] == "succeeded"

    # The run links to its task, and the task's page links back.
    page.find("tr.run").find_element(By.LINK_TEXT, task_id).click()
    wait_until(lambda: page.hash() == f"#/tasks/{task_id}", message="the run's task page")
    back = page.wait_find("a.schedule", message="the task's link to its schedule")
    assert back.get_attribute("href").endswith(f"#/schedules/{nightly['id']}") and back.text.startswith("run of ")
    back.click()
    wait_until(lambda: page.find("#view h1").text == "nightly-report" and page.find_all("tr.run"), message="the schedule again")

    # Delete asks once more, then the list no longer has it; its run's task stays.
    delete = page.find("button.delete")
    delete.click()
    assert delete.text == "Confirm: delete"
    assert api("GET", f"/schedules/{nightly['id']}")["name"] == "nightly-report"
    delete.click()
    wait_until(lambda: page.hash() == "#/schedules", message="the list after the delete")
    wait_until(lambda: [r.get_attribute("data-id") for r in page.find_all("tr.schedule")] == [hourly["id"]],
               message="only the other schedule listed")
    assert [s["id"] for s in api("GET", "/schedules")["schedules"]] == [hourly["id"]]
    assert server.task(task_id)["state"] == "succeeded"
    assert not page.axe_violations(), "axe-core objects to the schedules list"


@pytest.mark.console_allows(404)
def test_a_schedule_deleted_elsewhere_leaves_the_list_and_its_page_says_so(page, api):
    kept = create(api, "kept")
    gone = create(api, "gone")
    page.open("/schedules")
    wait_until(lambda: len(page.find_all("tr.schedule")) == 2, message="both schedules listed")
    page.wait_live()
    api("DELETE", f"/schedules/{gone['id']}")
    wait_until(lambda: [r.get_attribute("data-id") for r in page.find_all("tr.schedule")] == [kept["id"]],
               message="the deleted schedule to leave the list")

    page.go(f"/schedules/{kept['id']}")
    wait_until(lambda: page.find("#view h1").text == "kept", message="the schedule's page")
    page.wait_live()
    api("DELETE", f"/schedules/{kept['id']}")
    wait_until(lambda: page.find(".heading .badge").get_attribute("data-state") == "deleted", message="the page to say deleted")
    assert page.find("ol.next-runs").text == "Deleted: no more runs."
    assert not page.find("button.trigger").is_displayed()


def test_a_workflow_schedules_runs_link_to_their_workflow_and_follow_its_state(page, api, server):
    schedule = api("POST", "/schedules", {"name": "etl", "cron": YEARLY, "workflow": {"name": "etl", "tasks": [
        {"key": "extract", "kind": "noop"}, {"key": "load", "kind": "external", "dependencies": ["extract"]}]}})
    page.open(f"/schedules/{schedule['id']}")
    wait_until(lambda: page.find("#view h1").text == "etl", message="the schedule's page")
    page.wait_live()
    workflow = api("POST", f"/schedules/{schedule['id']}/trigger")
    wait_until(lambda: page.find_all("tr.run") and page.find("tr.run").get_attribute("data-state") == "running",
               message="the run, running while its external task waits")
    load = workflow["keys"]["load"]
    server.wait_task(load, lambda t: t["state"] == "running")
    api("POST", f"/tasks/{load}/complete", {"result": {}})
    wait_until(lambda: page.find("tr.run").get_attribute("data-state") == "succeeded", message="the run to show succeeded")
    page.find("tr.run").find_element(By.LINK_TEXT, workflow["id"]).click()
    wait_until(lambda: page.hash() == f"#/workflows/{workflow['id']}", message="the run's workflow page")
    # And back: the workflow's page links to the schedule that made it, as a task's page does.
    back = page.wait_find("a.schedule", message="the workflow's link to its schedule")
    assert back.text.startswith("schedule's run of ")
    back.click()
    wait_until(lambda: page.hash() == f"#/schedules/{schedule['id']}", message="the schedule's page again")


@pytest.mark.server(tokens=TOKENS)
@pytest.mark.console_allows(401)
def test_a_read_token_sees_schedules_but_cannot_change_them(page, server):
    schedule = create(server.api, "nightly-report")
    page.driver.get(f"{server.url}/ui#/schedules/{schedule['id']}")
    enter_token(page, READER)
    wait_until(lambda: page.find("#view h1").text == "nightly-report", message="the schedule's page")
    wait_until(lambda: page.find("#access").is_displayed(), message="the header to say the token only reads")
    assert assert_all_refused(page, "schedule", "needs an admin token; this token is read-only") == 3
    assert server.api("GET", f"/schedules/{schedule['id']}")["paused"] is False


def free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture
def replica():
    """One replica on a throwaway PostgreSQL: its schedules live in the cells it owns."""
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


# Known and not yet fixed: with replicas the dashboard's live views ask /events since=NaN (400),
# because api.js reads Event-Seq as a number and a replica answers a position. The list and the
# page still show; the console error is what fails. strict: the fix makes this test pass.
@pytest.mark.xfail(strict=True, reason="api.js follows events from Number(Event-Seq); replicas answer positions")
def test_with_a_replica_the_view_lists_and_opens_its_schedules(browser, replica):
    browser.get("about:blank")
    browser.get_log("browser")
    made = replica.api("POST", "/schedules", {"name": "replica-nightly", "cron": YEARLY, "task": {"kind": "noop"}})
    browser.get(f"{replica.url}/ui#/schedules")
    wait_until(lambda: browser.find_elements(By.CSS_SELECTOR, f'tr.schedule[data-id="{made["id"]}"]'),
               message="the schedule's row, read from the shared database")
    browser.get(f"{replica.url}/ui#/schedules/{made['id']}")
    wait_until(lambda: [e.text for e in browser.find_elements(By.CSS_SELECTOR, "#view h1")] == ["replica-nightly"],
               message="the schedule's page")
    problems = console_problems(browser.get_log("browser"))
    browser.get("about:blank")
    assert not problems, "console errors:\n" + "\n".join(problems)
