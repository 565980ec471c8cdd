"""What the dashboard lets a token do: with a read (or worker) token every view reads as before,
and every button that would change something is disabled, saying why; with an admin token the
same buttons work. The role comes from GET /whoami when a token is accepted."""

import signal

import pytest
from selenium.webdriver.common.by import By

from conftest import ApiError, scene, submit_named, wait_until

ADMIN = "admin-token-0123456789"
READER = "reader-token-0123456789"
WORKER = "worker-token-0123456789"
TOKENS = [(ADMIN, "admin"), (READER, "read"), (WORKER, "worker")]
# Buttons that only change what the page shows.
LOOKING = {"Filter", "Clear", "Clear selection", "Zoom in", "Zoom out", "Fit"}


def enter_token(page, token):
    dialog = page.find("#token-dialog")
    wait_until(lambda: dialog.get_attribute("open") is not None, message="the token dialog to open")
    page.find("#token-input").send_keys(token)
    dialog.find_element(By.XPATH, ".//button[normalize-space()='Use token']").click()
    wait_until(lambda: dialog.get_attribute("open") is None, message="the dialog to close")


def acting_controls(page):
    """The visible buttons (and limit fields) of the view that would change something."""
    controls = [button for button in page.find_all("#view button")
                if button.is_displayed() and (button.get_attribute("aria-label") or button.text.strip()) not in LOOKING]
    return controls + page.find_all("#view input.limit")


def assert_all_refused(page, view, reason):
    controls = acting_controls(page)
    assert controls, f"the {view} view shows no action to check"
    for control in controls:
        name = control.get_attribute("aria-label") or control.text
        assert not control.is_enabled(), f"{view}: {name} is enabled"
        assert control.get_attribute("title") == reason, f"{view}: {name} says {control.get_attribute('title')!r}"
        assert control.get_attribute("aria-description") == reason
    return len(controls)


def visit_every_view(page, ids, check):
    """Opens each view in turn and runs `check(view)` once it shows its content."""
    if page.hash() != "#/tasks":
        page.go("/tasks")
    wait_until(lambda: len(page.find_all("tr.task")) == 5, message="the five tasks listed")
    page.wait_row_state(ids["running"], "running")
    page.wait_row_state(ids["failed"], "failed")
    check("tasks")
    page.go("/queues")
    page.wait_find('tr[data-queue="lane"]')
    check("queues")
    page.go(f"/tasks/{ids['running']}")
    wait_until(lambda: page.find("h1").text == "long-sleep", message="the running task's page")
    check("running task")
    page.go(f"/tasks/{ids['failed']}")
    wait_until(lambda: page.find("h1").text == "flaky-job", message="the failed task's page")
    check("failed task")
    page.go(f"/workflows/{ids['workflow']}")
    wait_until(lambda: page.find_all("svg.graph a.node.state-failed"), message="the workflow graph")
    check("workflow")


@pytest.mark.server(tokens=TOKENS)
@pytest.mark.console_allows(401)
def test_a_read_token_reads_everything_and_every_change_is_disabled_saying_why(page, server):
    ids = scene(server)
    page.driver.get(f"{server.url}/ui#/tasks")
    enter_token(page, READER)
    reason = "needs an admin token; this token is read-only"
    wait_until(lambda: page.find("#access").is_displayed(), message="the header to say the token only reads")
    assert reason in page.find("#access").text

    checked = {}
    visit_every_view(page, ids, lambda view: checked.__setitem__(view, assert_all_refused(page, view, reason)))
    # Cancel and Retry of both rows and the bulk pair; Pause, the limit, Set and Cancel all of
    # each queue; one action on each task page; the workflow's two.
    assert checked["tasks"] >= 6 and checked["queues"] >= 8 and checked["workflow"] == 2, checked

    # Selecting tasks (a way of looking) still works; acting on them does not.
    page.go("/tasks")
    page.wait_row_state(ids["failed"], "failed")
    page.row(ids["failed"]).find_element(By.CSS_SELECTOR, "td.select input").click()
    wait_until(lambda: page.find(".bulk .selection").text == "1 selected", message="1 selected")
    for label in ("Cancel selected", "Retry selected"):
        assert not page.find(".bulk").find_element(By.XPATH, f".//button[normalize-space()='{label}']").is_enabled()
    assert not page.axe_violations(), "axe-core objects to the read-only page"

    # The stream is a read too: the page stays live.
    page.wait_live()
    fresh = submit_named(server.api, "noop", "seen-live")
    page.wait_row_state(fresh["id"], "succeeded")
    assert server.task(ids["running"])["state"] == "running" and server.api("GET", "/queues/lane")["paused"]


@pytest.mark.server(tokens=TOKENS)
@pytest.mark.console_allows(401)
def test_a_worker_token_cannot_cancel_retry_or_pause_either(page, server):
    ids = scene(server)
    page.driver.get(f"{server.url}/ui#/queues")
    enter_token(page, WORKER)
    reason = "needs an admin token; this is a worker token (it may only lease and report)"
    visit_every_view(page, ids, lambda view: assert_all_refused(page, view, reason))


@pytest.mark.server(tokens=TOKENS)
@pytest.mark.console_allows(401)
def test_the_buttons_work_once_the_token_is_an_admin_one(page, server):
    """The token file loses the read token (SIGHUP): the page asks again, learns the new
    token's role and draws its buttons enabled, without a reload."""
    ids = scene(server)
    page.driver.get(f"{server.url}/ui#/tasks")
    enter_token(page, READER)
    page.wait_row_state(ids["running"], "running")
    cancel = page.row(ids["running"]).find_element(By.CSS_SELECTOR, 'button[aria-label="Cancel long-sleep"]')
    assert not cancel.is_enabled()
    page.driver.execute_script("window.sameDocument = true")

    server.token_file.write_text(f"{ADMIN} admin\n")
    server.process.send_signal(signal.SIGHUP)

    def reader_refused():
        try:
            server.api("GET", "/whoami", token=READER)
        except ApiError as error:
            return error.status == 401
        return False

    wait_until(reader_refused, message="the server to forget the read token")
    page.go("/queues")
    enter_token(page, ADMIN)
    wait_until(lambda: not page.find("#access").is_displayed(), message="the header to stop saying view only")
    resume = lambda: page.find('tr[data-queue="lane"] button.pause')  # noqa: E731 (the view is drawn again)
    wait_until(lambda: resume().is_enabled() and not resume().get_attribute("title"), message="Resume enabled")
    assert page.driver.execute_script("return window.sameDocument === true"), "the page was reloaded"

    resume().click()
    wait_until(lambda: server.api("GET", "/queues/lane")["paused"] is False, message="the queue resumed")
    page.go("/tasks")
    page.wait_row_state(ids["running"], "running")
    page.row(ids["running"]).find_element(By.CSS_SELECTOR, 'button[aria-label="Cancel long-sleep"]').click()
    page.wait_row_state(ids["running"], "cancelled")
    page.row(ids["failed"]).find_element(By.CSS_SELECTOR, 'button[aria-label="Retry flaky-job"]').click()
    server.wait_task(ids["failed"], lambda t: t["attempt"] == 2)
    page.go(f"/workflows/{ids['workflow']}")
    retry = wait_until(lambda: [b for b in page.find_all("#view button") if b.text == "Retry failed and cancelled" and b.is_displayed()],
                       message="the workflow's retry")[0]
    assert retry.is_enabled() and retry.get_attribute("aria-description") is None
    retry.click()
    wait_until(lambda: "retried" in page.find("#toasts").text, message="the workflow retried")
