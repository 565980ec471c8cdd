"""The dashboard (/ui) in a real browser: what a person sees and does, checked against the API.

Every wait has a deadline and waits on a DOM or API state; no test sleeps to synchronise.
"""

import urllib.parse

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support.select import Select

from conftest import wait_until

TERMINAL = {"succeeded", "failed", "cancelled"}


def submit(api, kind, name=None, params=None, **fields):
    body = {"kind": kind, "params": params or {}, **fields}
    if name is not None:
        body["name"] = name
    return api("POST", "/tasks", body)


def listed_ids(api, **filters):
    """Every task id the API lists for these filters, newest first."""
    ids, after = [], None
    while True:
        query = urllib.parse.urlencode({**filters, "limit": 1000, **({"after": after} if after else {})})
        answer = api("GET", f"/tasks?{query}")
        ids += [task["id"] for task in answer["tasks"]]
        after = answer["next"]
        if not after:
            return ids


def hash_query(page):
    return dict(urllib.parse.parse_qsl(page.hash().partition("?")[2]))


def cell_text(row, index):
    return row.find_elements(By.CSS_SELECTOR, "td")[index].text


ATTEMPT_COLUMN = 6


# ---------------------------------------------------------------------------------------------
# Tasks table


def test_table_appears_goes_live_and_shows_new_tasks_without_reload(page, api):
    page.open("/tasks")
    page.wait_find("table.tasks")
    page.wait_live()
    assert page.find("tr.empty").text == "No tasks match these filters."
    page.driver.execute_script("window.sameDocument = true")

    noops = [submit(api, "noop", name=f"fresh-{index}") for index in range(3)]
    sleeper = submit(api, "sleep", name="napping", params={"duration_ms": 60000})

    for task in noops:
        page.wait_row_state(task["id"], "succeeded")
        assert page.row(task["id"]).find_element(By.CSS_SELECTOR, "td.name a").text == task["name"]
    page.wait_row_state(sleeper["id"], "running")
    assert page.row(sleeper["id"]).find_element(By.CSS_SELECTOR, ".badge").text == "running"
    # Newest first, as the API lists them.
    assert page.row_ids() == listed_ids(api)
    assert page.driver.execute_script("return window.sameDocument === true"), "the page was reloaded"
    assert not page.find_all("tr.empty")


def test_progress_bar_follows_reported_progress(page, api, server):
    page.open("/tasks")
    page.wait_live()
    task = submit(api, "external", name="upload")
    server.wait_task(task["id"], lambda t: t["state"] == "running")
    page.wait_row_state(task["id"], "running")

    def bar():
        return page.row(task["id"]).find_element(By.CSS_SELECTOR, 'div.bar[role="progressbar"]')

    def message():
        return page.row(task["id"]).find_element(By.CSS_SELECTOR, ".message").text

    assert bar().get_attribute("aria-valuenow") is None  # nothing reported yet
    # Someone about to act on the row keeps their place while it updates.
    page.row(task["id"]).find_element(By.CSS_SELECTOR, "td.select input").click()
    cancel = page.row(task["id"]).find_element(By.CSS_SELECTOR, 'button[aria-label="Cancel upload"]')
    page.driver.execute_script("arguments[0].focus()", cancel)
    api("POST", f"/tasks/{task['id']}/progress", {"fraction": 0.25, "message": "a quarter uploaded"})
    wait_until(lambda: bar().get_attribute("aria-valuenow") == "25" and message() == "a quarter uploaded",
               message="the bar at 25 with its message")
    api("POST", f"/tasks/{task['id']}/progress", {"fraction": 0.75, "message": "three quarters uploaded"})
    wait_until(lambda: bar().get_attribute("aria-valuenow") == "75" and message() == "three quarters uploaded",
               message="the bar at 75 with its message")
    assert bar().get_attribute("aria-label") == "Progress of upload"
    assert page.driver.switch_to.active_element == cancel, "the focused button lost focus on update"
    assert page.row(task["id"]).find_element(By.CSS_SELECTOR, "td.select input").is_selected(), "the selection was lost on update"

    api("POST", f"/tasks/{task['id']}/complete", {"result": {"bytes": 1024}})
    page.wait_row_state(task["id"], "succeeded")
    wait_until(lambda: bar().get_attribute("aria-valuenow") == "100", message="a succeeded task's bar at 100")


def test_cancel_a_running_task_from_its_row(page, api, server):
    task = submit(api, "sleep", name="long-sleep", params={"duration_ms": 600000})
    server.wait_task(task["id"], lambda t: t["state"] == "running")
    page.open("/tasks")
    page.wait_row_state(task["id"], "running")
    assert not page.row(task["id"]).find_element(By.CSS_SELECTOR, 'button[aria-label="Retry long-sleep"]').is_displayed()

    page.row(task["id"]).find_element(By.CSS_SELECTOR, 'button[aria-label="Cancel long-sleep"]').click()

    page.wait_row_state(task["id"], "cancelled")
    assert server.task(task["id"])["state"] == "cancelled"
    row = page.row(task["id"])
    assert row.find_element(By.CSS_SELECTOR, ".badge").text == "cancelled"
    assert not row.find_element(By.CSS_SELECTOR, 'button[aria-label="Cancel long-sleep"]').is_displayed()
    assert row.find_element(By.CSS_SELECTOR, 'button[aria-label="Retry long-sleep"]').is_displayed()
    wait_until(lambda: "long-sleep: cancel" in page.find("#toasts").text, message="a toast saying it was cancelled")


def test_retry_a_failed_task_from_its_row(page, api, server):
    task = submit(api, "sleep", name="flaky-job", params={"duration_ms": 300, "steps": 3, "outcome": "fail"})
    server.wait_task(task["id"], lambda t: t["state"] == "failed")
    page.open("/tasks")
    page.wait_row_state(task["id"], "failed")
    assert cell_text(page.row(task["id"]), ATTEMPT_COLUMN) == "1/1"

    page.row(task["id"]).find_element(By.CSS_SELECTOR, 'button[aria-label="Retry flaky-job"]').click()

    retried = server.wait_task(task["id"], lambda t: t["attempt"] == 2, "the API to show attempt 2")
    assert retried["max_attempts"] >= 2
    wait_until(lambda: cell_text(page.row(task["id"]), ATTEMPT_COLUMN) == f"2/{retried['max_attempts']}",
               message="the row to show attempt 2")
    # The second attempt runs and fails as the first did; the row follows it to the end.
    final = server.wait_task(task["id"], lambda t: t["state"] == "failed")
    assert final["attempt"] == 2
    page.wait_row_state(task["id"], "failed")


def test_bulk_cancel_of_selected_tasks(page, api, server):
    api("PATCH", "/queues/batch", {"max_concurrency": 10})
    tasks = [submit(api, "sleep", name=f"batch-{index}", params={"duration_ms": 600000}, queue="batch") for index in range(4)]
    for task in tasks:
        server.wait_task(task["id"], lambda t: t["state"] == "running")
    page.open("/tasks")
    for task in tasks:
        page.wait_row_state(task["id"], "running")
    chosen, spared = tasks[:3], tasks[3]
    bulk = page.find(".bulk")
    cancel_selected = bulk.find_element(By.XPATH, ".//button[normalize-space()='Cancel selected']")
    assert not cancel_selected.is_enabled()

    for task in chosen:
        page.row(task["id"]).find_element(By.CSS_SELECTOR, f'td.select input[aria-label="Select {task["name"]}"]').click()
    wait_until(lambda: page.find(".bulk .selection").text == "3 selected", message="3 selected")
    cancel_selected.click()

    for task in chosen:
        page.wait_row_state(task["id"], "cancelled")
        assert server.task(task["id"])["state"] == "cancelled"
    assert server.task(spared["id"])["state"] == "running"
    assert page.row(spared["id"]).get_attribute("data-state") == "running"
    wait_until(lambda: "3 cancelled" in page.find("#toasts").text, message="a toast counting 3 cancelled")
    assert page.find(".bulk .selection").text == "Nothing selected"

    # And back: the same three, retried together.
    for task in chosen:
        page.row(task["id"]).find_element(By.CSS_SELECTOR, "td.select input").click()
    wait_until(lambda: page.find(".bulk .selection").text == "3 selected", message="3 selected again")
    bulk.find_element(By.XPATH, ".//button[normalize-space()='Retry selected']").click()
    for task in chosen:
        server.wait_task(task["id"], lambda t: t["attempt"] == 2 and t["state"] == "running")
        page.wait_row_state(task["id"], "running")
        assert cell_text(page.row(task["id"]), ATTEMPT_COLUMN) == "2/2"
    wait_until(lambda: "3 retried" in page.find("#toasts").text, message="a toast counting 3 retried")


def test_filters_narrow_the_rows_and_live_in_the_url(page, api, server):
    made = [
        submit(api, "sleep", name="alpha-build", params={"duration_ms": 50, "steps": 1}),
        submit(api, "sleep", name="alpha-test", params={"duration_ms": 50, "steps": 1, "outcome": "fail"}),
        submit(api, "noop", name="alpha-deploy"),
        submit(api, "sleep", name="beta-build", params={"duration_ms": 50, "steps": 1}),
        submit(api, "sleep", name="beta-test", params={"duration_ms": 50, "steps": 1, "outcome": "fail"}),
        submit(api, "noop", name="beta-cleanup"),
        submit(api, "noop", name="gamma-report"),
        submit(api, "noop"),
    ]
    for task in made:
        server.wait_task(task["id"], lambda t: t["state"] in TERMINAL)
    page.open("/tasks")
    wait_until(lambda: page.row_ids() == listed_ids(api), message="every task listed")

    def shows(filters):
        expected = listed_ids(api, **filters)
        assert expected and len(expected) < len(made), f"{filters} should pick some tasks, not all: {expected}"
        wait_until(lambda: page.row_ids() == expected, message=f"the rows of {filters}: {expected}")
        wait_until(lambda: hash_query(page) == filters, message=f"the URL to carry {filters}")

    Select(page.find("#filter-state")).select_by_value("failed")
    shows({"state": "failed"})

    Select(page.find("#filter-state")).select_by_value("")
    page.find("#filter-kind").send_keys("noop")
    page.find("form.filters").find_element(By.XPATH, ".//button[normalize-space()='Filter']").click()
    shows({"kind": "noop"})

    page.find("#filter-kind").clear()
    Select(page.find("#filter-state")).select_by_value("succeeded")
    page.find("#filter-name").send_keys("alpha")
    shows({"state": "succeeded", "name": "alpha"})

    # A reload (or a shared link) keeps the filters.
    page.driver.refresh()
    page.wait_view()
    wait_until(lambda: page.row_ids() == listed_ids(api, state="succeeded", name="alpha"), message="the same rows after reload")
    assert Select(page.find("#filter-state")).first_selected_option.get_attribute("value") == "succeeded"
    assert page.find("#filter-name").get_attribute("value") == "alpha"
    assert page.find("#filter-kind").get_attribute("value") == ""

    page.find("form.filters").find_element(By.XPATH, ".//button[normalize-space()='Clear']").click()
    wait_until(lambda: page.row_ids() == listed_ids(api) and hash_query(page) == {}, message="all rows once cleared")


# ---------------------------------------------------------------------------------------------
# Queues


def test_pause_resume_and_limit_a_queue(page, api):
    page.open("/queues")
    row = page.wait_find('table.queues tr[data-queue="default"]')
    pause = row.find_element(By.CSS_SELECTOR, "button.pause")
    assert pause.text == "Pause"
    assert api("GET", "/queues/default")["paused"] is False

    pause.click()
    wait_until(lambda: api("GET", "/queues/default")["paused"] is True, message="the API to show default paused")
    wait_until(lambda: pause.text == "Resume", message="the button to read Resume")
    assert pause.get_attribute("aria-label") == "Resume default"
    assert row.find_element(By.CSS_SELECTOR, ".badge").text == "paused"

    pause.click()
    wait_until(lambda: api("GET", "/queues/default")["paused"] is False, message="the API to show default running")
    wait_until(lambda: pause.text == "Pause", message="the button to read Pause")

    limit = row.find_element(By.CSS_SELECTOR, "input.limit")
    new_limit = api("GET", "/queues/default")["max_concurrency"] + 5
    limit.clear()
    limit.send_keys(str(new_limit))
    limit.find_element(By.XPATH, "./ancestor::form//button[normalize-space()='Set']").click()
    wait_until(lambda: api("GET", "/queues/default")["max_concurrency"] == new_limit, message=f"the API to show limit {new_limit}")
    wait_until(lambda: f"default: limit {new_limit}" in page.find("#toasts").text, message="a toast naming the new limit")
    assert limit.get_attribute("value") == str(new_limit)


def test_set_and_lift_a_queues_cap_per_concurrency_key(page, api, server):
    api("PATCH", "/queues/tenants", {"max_concurrency": 5, "key_concurrency": 2})
    page.open("/queues")
    row = page.wait_find('table.queues tr[data-queue="tenants"]')
    per_key = row.find_element(By.CSS_SELECTOR, "input.per-key")
    wait_until(lambda: per_key.get_attribute("value") == "2", message="the cap the API shows")

    per_key.clear()
    per_key.send_keys("1")
    per_key.find_element(By.XPATH, "./ancestor::form//button[normalize-space()='Set']").click()
    wait_until(lambda: api("GET", "/queues/tenants")["key_concurrency"] == 1, message="the API to show a cap of 1")
    wait_until(lambda: "tenants: 1 per key" in page.find("#toasts").text, message="a toast naming the new cap")

    # Emptied, the field lifts the cap.
    per_key.clear()
    per_key.find_element(By.XPATH, "./ancestor::form//button[normalize-space()='Set']").click()
    wait_until(lambda: api("GET", "/queues/tenants")["key_concurrency"] is None, message="the API to show no cap")
    wait_until(lambda: "tenants: no cap per key" in page.find("#toasts").text, message="a toast saying there is no cap")

    # A task's page shows its key.
    task = submit(api, "noop", name="tenant-job", queue="tenants", concurrency_key="tenant-42")
    server.wait_task(task["id"], lambda t: t["state"] in TERMINAL)
    page.open(f"/tasks/{task['id']}")
    wait_until(lambda: page.find("h1").text == "tenant-job", message="the task's page")
    wait_until(lambda: "tenant-42" in page.section("Task").text, message="the concurrency key among the task's facts")


def test_set_and_remove_a_queues_rate_limit(page, api):
    api("PATCH", "/queues/emails", {"rate_limit": {"per_second": 5, "burst": 10}})
    page.open("/queues")
    row = page.wait_find('table.queues tr[data-queue="emails"]')
    shown = row.find_element(By.CSS_SELECTOR, ".rate-limit")
    wait_until(lambda: shown.text == "5/s, burst 10", message="the rate limit shown")

    per_second = row.find_element(By.CSS_SELECTOR, "input.rate-per-second")
    burst = row.find_element(By.CSS_SELECTOR, "input.rate-burst")
    per_second.clear()
    per_second.send_keys("0.5")
    burst.clear()
    burst.send_keys("2")
    row.find_element(By.CSS_SELECTOR, 'button[aria-label="Set the rate limit of emails"]').click()
    wait_until(lambda: api("GET", "/queues/emails")["rate_limit"] == {"per_second": 0.5, "burst": 2},
               message="the API to show 0.5/s, burst 2")
    wait_until(lambda: shown.text == "0.5/s, burst 2", message="the new rate limit shown")
    wait_until(lambda: "emails: rate limit 0.5/s, burst 2" in page.find("#toasts").text, message="a toast naming the rate limit")

    # An empty rate removes the limit.
    per_second.clear()
    row.find_element(By.CSS_SELECTOR, 'button[aria-label="Set the rate limit of emails"]').click()
    wait_until(lambda: api("GET", "/queues/emails")["rate_limit"] is None, message="the API to show no rate limit")
    wait_until(lambda: shown.text == "none", message="no rate limit shown")

    # A change made elsewhere arrives as queue.updated.
    api("PATCH", "/queues/emails", {"rate_limit": {"per_second": 20, "burst": 1}})
    wait_until(lambda: shown.text == "20/s, burst 1", message="the rate limit set through the API shown")


def test_queue_counts_follow_the_tasks(page, api, server):
    api("PATCH", "/queues/mail", {"paused": True})
    page.open("/queues")
    row = page.wait_find('table.queues tr[data-queue="mail"]')
    queued = row.find_element(By.CSS_SELECTOR, 'a[aria-label="queued tasks of mail"]')
    assert queued.text == "0"
    for index in range(3):
        submit(api, "noop", name=f"letter-{index}", queue="mail")
    wait_until(lambda: queued.text == "3", message="3 queued in mail")

    cancel_all = row.find_element(By.CSS_SELECTOR, 'button[aria-label="Cancel every unfinished task of mail"]')
    cancel_all.click()
    wait_until(lambda: cancel_all.text == "Confirm: cancel all", message="the button to ask for confirmation")
    assert api("GET", "/queues/mail")["counts"]["queued"] == 3, "one click must not cancel"
    cancel_all.click()
    wait_until(lambda: api("GET", "/queues/mail")["counts"]["cancelled"] == 3, message="the API to count 3 cancelled")
    cancelled = row.find_element(By.CSS_SELECTOR, 'a[aria-label="cancelled tasks of mail"]')
    wait_until(lambda: cancelled.text == "3" and queued.text == "0", message="the counts to follow")
    wait_until(lambda: "mail: 3 cancelled" in page.find("#toasts").text, message="a toast counting them")

    cancelled.click()
    wait_until(lambda: hash_query(page) == {"queue": "mail", "state": "cancelled"}, message="the tasks view filtered by the count's link")
    wait_until(lambda: page.row_ids() == listed_ids(api, queue="mail", state="cancelled"), message="the 3 cancelled letters")


# ---------------------------------------------------------------------------------------------
# Task page


def test_task_page_shows_what_was_asked_and_what_happened(page, api, server):
    workflow = api("POST", "/workflows", {"name": "release", "tasks": [
        {"key": "prepare", "kind": "noop", "name": "prepare"},
        {"key": "compile", "kind": "sleep", "name": "compile", "params": {"duration_ms": 300, "steps": 3},
         "metadata": {"owner": "build-team", "ticket": 4711}, "dependencies": ["prepare"]},
        {"key": "package", "kind": "noop", "name": "package", "dependencies": ["compile"]},
    ]})
    ids = workflow["keys"]
    broken = submit(api, "sleep", name="smoke-test", params={"duration_ms": 100, "steps": 1, "outcome": "fail"})
    for task_id in [*ids.values(), broken["id"]]:
        server.wait_task(task_id, lambda t: t["state"] in TERMINAL)

    # Open it by id from the header, as someone pasting an id from a log would.
    page.open("/tasks")
    page.find("#jump-id").send_keys(ids["compile"], Keys.ENTER)
    wait_until(lambda: page.hash() == f"#/tasks/{ids['compile']}", message="the task's page")
    wait_until(lambda: page.find("h1").text == "compile", message="the task's name as heading")

    assert '"duration_ms": 300' in page.section("Params").text
    assert '"owner": "build-team"' in page.section("Metadata").text
    assert '"ticket": 4711' in page.section("Metadata").text
    assert "release" in page.section("Task").text or workflow["id"] in page.section("Task").text
    wait_until(lambda: page.section("Depends on").find_elements(By.CSS_SELECTOR, f'a[href="#/tasks/{ids["prepare"]}"]'),
               message="a link to the dependency")
    assert page.section("Depends on").find_element(By.CSS_SELECTOR, "a").text == "prepare"
    dependent = wait_until(lambda: (page.section("Dependents").find_elements(By.CSS_SELECTOR, f'a[href="#/tasks/{ids["package"]}"]') or [None])[0],
                           message="a link to the dependent")
    assert dependent.text == "package"
    assert page.section("Error").text.strip() == "Error\n—"

    def history():
        return [item.text for item in page.find_all("ol.history li")]

    def states_in_history():
        wanted = ["created", "running (attempt 1)", "succeeded (attempt 1)"]
        found = [next((index for index, line in enumerate(history()) if wanted_line in line), None) for wanted_line in wanted]
        return None not in found and found == sorted(found)

    wait_until(states_in_history, message="created, running and succeeded in order in the event history")
    assert any("progress" in line for line in history())
    attempts = page.find_all("table.attempts tbody tr")
    assert len(attempts) == 1 and "succeeded" in attempts[0].text
    assert not page.driver.find_element(By.XPATH, "//div[@class='heading']//button[normalize-space()='Retry']").is_displayed()

    # Follow the dependent's link.
    dependent.click()
    wait_until(lambda: page.find("h1").text == "package", message="the dependent's page")
    wait_until(lambda: page.section("Depends on").find_elements(By.CSS_SELECTOR, f'a[href="#/tasks/{ids["compile"]}"]'),
               message="package depends on compile")

    # A failed task shows its error.
    failed = server.task(broken["id"])
    page.go(f"/tasks/{broken['id']}")
    wait_until(lambda: page.find("h1").text == "smoke-test", message="the failed task's page")
    error = page.section("Error").text
    assert failed["error"]["code"] in error and failed["error"]["message"] in error
    wait_until(lambda: failed["error"]["code"] in " ".join(row.text for row in page.find_all("table.attempts tbody tr")),
               message="the attempt's error in the attempts table")
    retry = page.driver.find_element(By.XPATH, "//div[@class='heading']//button[normalize-space()='Retry']")
    assert retry.is_displayed()
    assert not page.driver.find_element(By.XPATH, "//div[@class='heading']//button[normalize-space()='Cancel']").is_displayed()

    # Retried from its page, it runs (and fails) again: a second attempt in the table.
    retry.click()
    server.wait_task(broken["id"], lambda t: t["attempt"] == 2 and t["state"] == "failed")
    wait_until(lambda: [row.find_element(By.CSS_SELECTOR, "td").text for row in page.find_all("table.attempts tbody tr")] == ["1", "2"],
               message="two attempts in the table")
    wait_until(lambda: any(f"failed — {failed['error']['code']}" in item.text and item.text.endswith("(attempt 2)")
                           for item in page.find_all("ol.history li")),
               message="the second failure, with its error, in the history")


def test_a_scheduled_task_shows_its_time_then_runs(page, api, server):
    later = submit(api, "noop", name="nightly-report", delay_ms=600000, ttl_ms=900000, queue="reports")
    soon = submit(api, "noop", name="in-a-moment", delay_ms=1500, queue="reports")
    assert later["state"] == "scheduled" and soon["state"] == "scheduled"

    page.open("/tasks?queue=reports")
    page.wait_live()
    page.wait_row_state(later["id"], "scheduled")
    assert "runs " in page.row(later["id"]).text
    # The other one's time comes: its row moves on by itself.
    page.wait_row_state(soon["id"], "succeeded")

    page.go(f"/tasks/{later['id']}")
    wait_until(lambda: page.find("h1").text == "nightly-report", message="the scheduled task's page")
    wait_until(lambda: "Scheduled for" in page.section("Timings").text, message="its time among the timings")
    timings = page.section("Timings").text
    assert "Expires" in timings and "Started\n—" in timings

    # The queues page counts it among the scheduled.
    page.go("/queues")
    wait_until(lambda: "scheduled" in [cell.text.lower() for cell in page.find_all("table thead th")],
               message="a scheduled column")


def test_task_page_follows_a_running_task(page, api, server):
    task = submit(api, "external", name="transcode", metadata={"file": "talk.mp4"})
    server.wait_task(task["id"], lambda t: t["state"] == "running")
    page.open(f"/tasks/{task['id']}")
    wait_until(lambda: page.find("h1").text == "transcode", message="the task's page")
    page.wait_live()
    bar = page.section("Progress").find_element(By.CSS_SELECTOR, 'div.bar[role="progressbar"]')
    assert page.find(".heading .badge").text == "running"

    api("POST", f"/tasks/{task['id']}/progress", {"fraction": 0.4, "message": "encoding audio"})
    wait_until(lambda: bar.get_attribute("aria-valuenow") == "40" and page.section("Progress").find_element(By.CSS_SELECTOR, ".message").text == "encoding audio",
               message="the bar at 40 with its message")
    wait_until(lambda: any("progress 40% encoding audio" in item.text for item in page.find_all("ol.history li")),
               message="the progress in the history")

    api("POST", f"/tasks/{task['id']}/complete", {"result": {"duration_s": 1312}})
    wait_until(lambda: page.find(".heading .badge").text == "succeeded", message="the badge to read succeeded")
    wait_until(lambda: '"duration_s": 1312' in page.section("Result").text, message="the result shown")
    wait_until(lambda: bar.get_attribute("aria-valuenow") == "100", message="the bar full")
    assert not page.driver.find_element(By.XPATH, "//div[@class='heading']//button[normalize-space()='Cancel']").is_displayed()


def test_task_history_shows_each_progress_as_it_was(page, api, server):
    task = submit(api, "sleep", name="steady", params={"duration_ms": 1000, "steps": 4})
    server.wait_task(task["id"], lambda t: t["state"] == "succeeded")
    page.open(f"/tasks/{task['id']}")
    wait_until(lambda: any(item.text.endswith("succeeded (attempt 1)") for item in page.find_all("ol.history li")),
               message="the history up to succeeded")
    lines = [item.text.split(" ", 1)[1] for item in page.find_all("ol.history li")]
    progress = [line for line in lines if line.startswith("progress ")]
    percents = [int(line.split()[1].rstrip("%")) for line in progress]
    assert progress and percents == sorted(set(percents)) and percents[-1] < 100, f"history: {lines}"
    assert lines[0].startswith("created (") and "succeeded" not in " ".join(lines[:-1]), f"history: {lines}"


@pytest.mark.console_allows(404)
def test_unknown_ids_are_reported(page, api):
    page.open("/tasks")
    jump = page.find("#jump-id")
    jump.send_keys("01NOSUCHTASK0000000000000", Keys.ENTER)
    wait_until(lambda: jump.get_property("validationMessage") == "No task or workflow has that id.",
               message="the id box to say nothing has that id")
    assert page.hash() == "#/tasks"

    page.go("/tasks/01NOSUCHTASK0000000000000")
    wait_until(lambda: page.find("#view h1").text == "Not found", message="a Not found notice")
    page.find("#view").find_element(By.LINK_TEXT, "Back to tasks").click()
    wait_until(lambda: page.find_all("table.tasks"), message="the tasks table again")


# ---------------------------------------------------------------------------------------------
# Workflow graph


def test_workflow_graph_follows_states_and_links_to_tasks(page, api, server):
    api("PATCH", "/queues/ci", {"paused": True, "max_concurrency": 4})
    spec = [
        ("checkout", "noop", {}, []),
        ("compile", "sleep", {"duration_ms": 2500, "steps": 5}, ["checkout"]),
        ("lint", "noop", {}, ["checkout"]),
        ("unit-tests", "noop", {}, ["compile"]),
        ("docs", "noop", {}, ["lint"]),
        ("release", "noop", {}, ["unit-tests", "docs"]),
    ]
    workflow = api("POST", "/workflows", {"name": "ci", "tasks": [
        {"key": key, "name": key, "kind": kind, "params": params, "queue": "ci", "dependencies": deps} for key, kind, params, deps in spec]})
    ids = workflow["keys"]

    page.open(f"/workflows/{workflow['id']}")
    wait_until(lambda: page.find("h1").text == "ci", message="the workflow's name as heading")
    nodes = page.find_all("svg.graph a.node")
    assert sorted(node.get_attribute("data-id") for node in nodes) == sorted(ids.values())
    assert len(page.find_all("svg.graph g.edges path")) == sum(len(deps) for *_, deps in spec)

    def node_class(key):
        return page.find(f'svg.graph a.node[data-id="{ids[key]}"]').get_attribute("class").split()

    assert "state-queued" in node_class("checkout")
    assert "state-pending" in node_class("release")
    page.wait_live()

    api("PATCH", "/queues/ci", {"paused": False})
    wait_until(lambda: "state-running" in node_class("compile"), message="compile's node to show running")
    wait_until(lambda: "state-succeeded" in node_class("compile"), message="compile's node to show succeeded")
    wait_until(lambda: all("state-succeeded" in node_class(key) for key in ids), message="every node succeeded")
    assert api("GET", f"/workflows/{workflow['id']}")["state"] == "succeeded"
    wait_until(lambda: page.find('section.card div.bar[role="progressbar"]').get_attribute("aria-valuenow") == "100",
               message="the aggregate bar at 100")

    page.find(f'svg.graph a.node[data-id="{ids["release"]}"]').click()
    wait_until(lambda: page.hash() == f"#/tasks/{ids['release']}", message="the node's task page")
    wait_until(lambda: page.find("h1").text == "release", message="release's page")


def test_cancel_and_retry_a_workflow_from_its_page(page, api, server):
    workflow = api("POST", "/workflows", {"name": "deploy", "tasks": [
        {"key": "build", "name": "build", "kind": "sleep", "params": {"duration_ms": 600000}},
        {"key": "test", "name": "test", "kind": "noop", "dependencies": ["build"]},
        {"key": "ship", "name": "ship", "kind": "noop", "dependencies": ["test"]},
    ]})
    ids = workflow["keys"]
    server.wait_task(ids["build"], lambda t: t["state"] == "running")
    page.open(f"/workflows/{workflow['id']}")
    wait_until(lambda: len(page.find_all("svg.graph a.node")) == 3, message="the graph")
    page.wait_live()

    def node_state(key):
        return next(name for name in page.find(f'svg.graph a.node[data-id="{ids[key]}"]').get_attribute("class").split() if name.startswith("state-"))

    cancel = page.driver.find_element(By.XPATH, "//button[normalize-space()='Cancel workflow']")
    retry = page.driver.find_element(By.XPATH, "//button[normalize-space()='Retry failed and cancelled']")
    assert node_state("build") == "state-running" and not retry.is_displayed()

    cancel.click()
    wait_until(lambda: all(node_state(key) == "state-cancelled" for key in ids), message="every node cancelled")
    assert api("GET", f"/workflows/{workflow['id']}")["state"] == "cancelled"
    wait_until(lambda: page.find(".heading .badge").text == "cancelled", message="the workflow badge to read cancelled")
    wait_until(lambda: retry.is_displayed() and not cancel.is_displayed(), message="Retry offered instead of Cancel")

    retry.click()
    server.wait_task(ids["build"], lambda t: t["attempt"] == 2 and t["state"] == "running")
    wait_until(lambda: node_state("build") == "state-running" and node_state("ship") == "state-pending", message="the graph running again")
    wait_until(lambda: "3 retried" in page.find("#toasts").text, message="a toast counting 3 retried")
    wait_until(lambda: cancel.is_displayed() and not retry.is_displayed(), message="Cancel offered again")


def test_a_2000_task_workflow_graph_renders_and_zooms(page, api):
    api("PATCH", "/queues/big", {"paused": True})
    # Forty layers of fifty; each task after the first layer waits for one or two of the layer before.
    width, layers = 50, 40
    tasks, edges = [], 0
    for layer in range(layers):
        for slot in range(width):
            deps = [] if layer == 0 else sorted({f"t{layer - 1}-{slot}", f"t{layer - 1}-{(slot * 7) % width}"})
            edges += len(deps)
            tasks.append({"key": f"t{layer}-{slot}", "kind": "noop", "queue": "big", "dependencies": deps})
    workflow = api("POST", "/workflows", {"name": "big", "tasks": tasks})

    page.open(f"/workflows/{workflow['id']}")
    wait_until(lambda: len(page.find_all("svg.graph a.node")) == width * layers, message="2,000 nodes")
    assert page.driver.execute_script("return document.querySelectorAll('svg.graph g.edges path').length") == edges

    def view_box():
        return [float(value) for value in page.find("svg.graph").get_dom_attribute("viewBox").split()]

    fitted = view_box()
    assert fitted[0] == -20 and fitted[1] == -20
    page.find('button[aria-label="Zoom in"]').click()
    zoomed_in = view_box()
    assert zoomed_in[2] < fitted[2] and zoomed_in[3] < fitted[3]
    page.find('button[aria-label="Zoom out"]').click()
    page.find('button[aria-label="Zoom out"]').click()
    zoomed_out = view_box()
    assert zoomed_out[2] > zoomed_in[2]
    page.driver.find_element(By.XPATH, "//div[@role='toolbar']//button[normalize-space()='Fit']").click()
    assert view_box() == fitted


# ---------------------------------------------------------------------------------------------
# Many tasks


def test_a_10000_task_table_scrolls_to_the_end_with_few_rows_in_the_dom(page, api):
    api("PATCH", "/queues/bulk", {"paused": True})
    ids = []
    for batch in range(10):
        workflow = api("POST", "/workflows", {"name": f"batch-{batch}", "tasks": [
            {"key": f"k{index}", "name": f"item-{batch}-{index}", "kind": "noop", "queue": "bulk"} for index in range(1000)]})
        ids += [task["id"] for task in workflow["tasks"]]
    assert len(ids) == 10000
    oldest = min(ids)

    page.open("/tasks")
    status = page.find(".status")
    scroller = page.find(".scroller")
    wait_until(lambda: "more as you scroll" in status.text, message="the first page loaded")
    assert len(page.find_all("tr.task")) < 200

    def loaded():
        return int("".join(ch for ch in status.text.split()[0] if ch.isdigit()) or 0)

    timings = []
    while "more as you scroll" in status.text:
        before = loaded()
        timings.append(page.driver.execute_async_script("""
            const [scroller, done] = arguments;
            const start = performance.now();
            scroller.scrollTop = scroller.scrollHeight;
            requestAnimationFrame(() => requestAnimationFrame(() => done(performance.now() - start)));
        """, scroller))
        wait_until(lambda: loaded() > before or "more as you scroll" not in status.text, message=f"more than {before} loaded")
        assert len(page.find_all("tr.task")) < 200
    wait_until(lambda: status.text == "10,000 tasks", message="all 10,000 loaded")
    page.driver.execute_script("arguments[0].scrollTop = arguments[0].scrollHeight", scroller)
    last = page.wait_find(f'tr.task[data-id="{oldest}"]', message="the oldest task's row at the bottom")
    assert page.driver.execute_script("""
        const [row, scroller] = arguments;
        const r = row.getBoundingClientRect(), s = scroller.getBoundingClientRect();
        return r.top >= s.top && r.bottom <= s.bottom + 1;
    """, last, scroller), "the last row is not in view"
    assert last.find_element(By.CSS_SELECTOR, "td.name a").text == "item-0-0"
    assert len(page.find_all("tr.task")) < 200
    # The rows drawn are the right slice of the list, in order.
    newest_first = sorted(ids, reverse=True)
    for position in (0.5, 1.0):
        page.driver.execute_script("arguments[0].scrollTop = (arguments[0].scrollHeight - arguments[0].clientHeight) * arguments[1]", scroller, position)
        def in_order():
            rows = page.find_all("tr.task")
            first = int(rows[0].get_attribute("aria-rowindex")) - 2
            return [row.get_attribute("data-id") for row in rows] == newest_first[first:first + len(rows)] and first > 0
        wait_until(in_order, message=f"the rows at {position:.0%} of the list in order")
    print(f"scroll steps: {len(timings)}, slowest {max(timings):.1f} ms to two frames")


# ---------------------------------------------------------------------------------------------
# Access


@pytest.mark.server(token="secret-token-0123456789")
@pytest.mark.console_allows(401)
def test_token_dialog_asks_once_per_tab(page, api):
    submit(api, "noop", name="guarded")
    page.driver.get(f"{page.server.url}/ui#/tasks")
    dialog = page.find("#token-dialog")
    wait_until(lambda: dialog.get_attribute("open") is not None, message="the token dialog to open")
    assert "needs a token" in dialog.text

    page.find("#token-input").send_keys("wrong")
    dialog.find_element(By.XPATH, ".//button[normalize-space()='Use token']").click()
    wait_until(lambda: dialog.get_attribute("open") is not None and "refused" in page.find("#token-reason").text,
               message="the dialog to reopen saying the token was refused")

    page.find("#token-input").send_keys("secret-token-0123456789")
    dialog.find_element(By.XPATH, ".//button[normalize-space()='Use token']").click()
    wait_until(lambda: dialog.get_attribute("open") is None, message="the dialog to close")
    page.wait_find("tr.task", message="the table with the task")
    page.wait_live()
    assert [row.find_element(By.CSS_SELECTOR, "td.name a").text for row in page.find_all("tr.task")] == ["guarded"]

    page.driver.refresh()
    page.wait_find("tr.task", message="the table after reload")
    page.wait_live()
    assert page.find("#token-dialog").get_attribute("open") is None
