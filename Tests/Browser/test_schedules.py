"""The dashboard's Schedules view in a real browser: the list follows the API as schedules come,
change, end and go; a schedule's page pauses, runs now (the run and its state appear in its last
runs, linked both ways with the run's task) and deletes; on a replica (event ids are positions
there) both follow the API as on a single server.

Every wait has a deadline and waits on a DOM or API state; no test sleeps to synchronise.
"""

import datetime

import pytest
from selenium.webdriver.common.by import By

from conftest import Page, console_problems, wait_until
from test_access import READER, TOKENS, assert_all_refused, enter_token

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
    # The page may render again as its history arrives: read the link as it stands each time.
    wait_until(lambda: page.find("a.schedule").get_attribute("href").endswith(f"#/schedules/{nightly['id']}")
               and page.find("a.schedule").text.startswith("run of "), message="the task's link to its schedule")
    wait_until(lambda: page.find("a.schedule").click() or True, message="the link to take a click")
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


def test_a_schedule_past_its_last_slot_says_it_ended_without_a_reload(page, api):
    # Every 2 s until 5 s from now: two or three runs, then none (what the API says too).
    end_at = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=5)
    ending = create(api, "ending", cron="*/2 * * * * *", end_at=end_at.isoformat(timespec="milliseconds").replace("+00:00", "Z"))
    page.open("/schedules")
    wait_until(lambda: page.find_all(f'tr.schedule[data-id="{ending["id"]}"]'), message="the schedule's row")
    page.driver.execute_script("window.sameDocument = true")
    assert cells(page, ending["id"])[3] == "active" and cells(page, ending["id"])[4] != "—"
    wait_until(lambda: cells(page, ending["id"])[3:5] == ["ended", "—"], message="the row to say ended, with no next run")
    assert api("GET", f"/schedules/{ending['id']}")["next_runs"] == []

    row(page, ending["id"]).find_element(By.LINK_TEXT, "ending").click()
    wait_until(lambda: page.find("#view h1").text == "ending", message="the schedule's page")
    assert page.find(".heading .badge").get_attribute("data-state") == "ended"
    assert page.find("ol.next-runs").text == "None: the schedule has ended."
    assert page.find_all("tr.run") and page.driver.execute_script("return window.sameDocument === true"), "the page was reloaded"


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
    wait_until(lambda: page.find("a.schedule").text.startswith("schedule's run of "),
               message="the workflow's link to its schedule")
    wait_until(lambda: page.find("a.schedule").click() or True, message="the link to take a click")
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


def test_with_a_replica_the_view_lists_and_opens_its_schedules(browser, replica):
    """On a replica, event ids are positions, not numbers: the list and the page follow
    `schedule.updated` from them all the same, without a reload."""
    browser.get("about:blank")
    browser.get_log("browser")
    page = Page(browser, replica)
    made = create(replica.api, "replica-nightly")
    page.open("/schedules")
    wait_until(lambda: page.find_all(f'tr.schedule[data-id="{made["id"]}"]'), message="the schedule's row, read from the shared database")
    page.wait_live()
    browser.execute_script("window.sameDocument = true")
    later = create(replica.api, "a-replica-hourly")
    wait_until(lambda: [r.get_attribute("data-id") for r in page.find_all("tr.schedule")] == [later["id"], made["id"]],
               message="the schedule made after the page loaded, listed first")
    replica.api("PATCH", f"/schedules/{made['id']}", {"paused": True})
    wait_until(lambda: cells(page, made["id"])[3] == "paused", message="the pause made through the API")

    row(page, made["id"]).find_element(By.LINK_TEXT, "replica-nightly").click()
    wait_until(lambda: page.find("#view h1").text == "replica-nightly", message="the schedule's page")
    page.wait_live()
    replica.api("PATCH", f"/schedules/{made['id']}", {"paused": False})
    wait_until(lambda: page.find(".heading .badge").get_attribute("data-state") == "active", message="the resume made through the API")
    replica.api("POST", f"/schedules/{made['id']}/trigger")
    wait_until(lambda: page.find_all("tr.run") and page.find("tr.run").get_attribute("data-state") == "succeeded",
               message="the run made through the API, succeeded")
    assert browser.execute_script("return window.sameDocument === true"), "the page was reloaded"
    problems = console_problems(browser.get_log("browser"))
    browser.get("about:blank")
    assert not problems, "console errors:\n" + "\n".join(problems)
