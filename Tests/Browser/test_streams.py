"""One event stream for a whole browser. Each stream holds one of the six connections a browser
opens to a server, so views that each kept their own (or left theirs open) would starve the
buttons: a click's request would wait for a free connection. Here three tabs go through every
view twenty times; the server never counts more than one stream, a closed leader tab hands the
stream to another, and every action button still answers within a second. Six tabs (a stream
each filled every connection) leave a click its connection."""

import os

from selenium.webdriver.common.by import By

from conftest import scene, submit_named, wait_until

# What a click may take, request and answer included (TASKLOOP_UI_TIMEOUT_SCALE stretches it).
PROMPT = 1.0 * float(os.environ.get("TASKLOOP_UI_TIMEOUT_SCALE", "1"))


def promptly(predicate, message):
    """Waits at most PROMPT for the API to show what a click did."""
    return wait_until(predicate, timeout=PROMPT, message=message, interval=0.02)


def test_twenty_rounds_of_every_view_in_three_tabs_hold_one_stream_and_every_button_answers(page, api, server):
    ids = scene(server, concurrency=20)
    routes = ["/tasks", f"/tasks/{ids['running']}", f"/workflows/{ids['workflow']}", "/queues", f"/tasks/{ids['failed']}"]

    driver = page.driver
    page.open("/queues")
    tabs = [driver.current_window_handle]
    for _ in range(2):
        driver.switch_to.new_window("tab")
        page.open("/queues")
        tabs.append(driver.current_window_handle)
    try:
        for round_ in range(20):
            for tab in tabs:
                driver.switch_to.window(tab)
                for route in routes:
                    page.go(route)
            # A view's catch-up (a bounded replay) may still be ending; the shared stream stays.
            wait_until(lambda: server.event_streams() <= 1, message=f"one stream after round {round_ + 1}, not {server.event_streams()}")
        for tab in tabs:
            driver.switch_to.window(tab)
            page.wait_live()
        assert server.event_streams() == 1

        # Every action, from the last tab, each answered within a second.
        page.go("/queues")
        pause = lambda: page.find('tr[data-queue="default"] button.pause')  # noqa: E731 (rows are redrawn)
        pause().click()
        promptly(lambda: api("GET", "/queues/default")["paused"], "Pause to reach the server")
        wait_until(lambda: pause().text == "Resume", message="the button to read Resume")
        pause().click()
        promptly(lambda: not api("GET", "/queues/default")["paused"], "Resume to reach the server")
        limit = page.find('tr[data-queue="default"] input.limit')
        limit.clear()
        limit.send_keys("17")
        limit.find_element(By.XPATH, "./ancestor::form//button[normalize-space()='Set']").click()
        promptly(lambda: api("GET", "/queues/default")["max_concurrency"] == 17, "the new limit to reach the server")
        cancel_all = lambda: page.find('tr[data-queue="lane"] td.actions button.danger')  # noqa: E731
        cancel_all().click()
        wait_until(lambda: cancel_all().text == "Confirm: cancel all", message="Cancel all to ask for confirmation")
        cancel_all().click()
        promptly(lambda: server.task(ids["held"])["state"] == "cancelled", "Cancel all to reach the server")

        page.go(f"/tasks/{ids['running']}")
        wait_until(lambda: page.find("h1").text == "long-sleep", message="the running task's page")
        page.find(".heading button.danger").click()
        promptly(lambda: server.task(ids["running"])["state"] == "cancelled", "Cancel to reach the server")
        retry = wait_until(lambda: [b for b in page.find_all(".heading button") if b.text == "Retry" and b.is_displayed()], message="Retry")
        retry[0].click()
        promptly(lambda: server.task(ids["running"])["attempt"] == 2, "Retry to reach the server")

        page.go("/tasks")
        page.wait_row_state(ids["failed"], "failed")
        page.row(ids["failed"]).find_element(By.CSS_SELECTOR, 'button[aria-label="Retry flaky-job"]').click()
        promptly(lambda: server.task(ids["failed"])["attempt"] == 2, "a row's Retry to reach the server")
        page.wait_row_state(ids["running"], "running")
        page.row(ids["running"]).find_element(By.CSS_SELECTOR, "td.select input").click()
        page.find(".bulk").find_element(By.XPATH, ".//button[normalize-space()='Cancel selected']").click()
        promptly(lambda: server.task(ids["running"])["state"] == "cancelled", "Cancel selected to reach the server")
        page.wait_row_state(ids["running"], "cancelled")
        wait_until(lambda: page.find(".bulk .selection").text == "Nothing selected", message="the selection cleared")
        page.row(ids["running"]).find_element(By.CSS_SELECTOR, "td.select input").click()
        page.find(".bulk").find_element(By.XPATH, ".//button[normalize-space()='Retry selected']").click()
        promptly(lambda: server.task(ids["running"])["attempt"] == 3, "Retry selected to reach the server")

        page.go(f"/workflows/{ids['workflow']}")
        wait_until(lambda: page.find_all("svg.graph a.node.state-failed"), message="the workflow graph")
        page.find(".heading button.danger").click()
        promptly(lambda: server.task(ids["workflow_keys"]["slow"])["state"] == "cancelled", "Cancel workflow to reach the server")
        retry = wait_until(lambda: [b for b in page.find_all(".heading button") if b.text == "Retry failed and cancelled" and b.is_displayed()],
                           message="the workflow's Retry")
        retry[0].click()
        promptly(lambda: server.task(ids["workflow_keys"]["bad"])["attempt"] == 2, "the workflow's Retry to reach the server")

        # The leading tab (the first) closes: another takes the stream over, and stays live.
        driver.switch_to.window(tabs[0])
        driver.close()
        driver.switch_to.window(tabs[1])
        page.go("/tasks")
        page.wait_live()
        fresh = submit_named(api, "noop", "after-handover")
        page.wait_row_state(fresh["id"], "succeeded")
        driver.switch_to.window(tabs[2])
        page.go("/tasks")
        page.wait_row_state(fresh["id"], "succeeded")
        wait_until(lambda: server.event_streams() == 1, message="one stream after the handover")
    finally:
        for tab in driver.window_handles[1:]:
            driver.switch_to.window(tab)
            driver.close()
        driver.switch_to.window(driver.window_handles[0])


def test_six_tabs_leave_connections_for_the_buttons(page, api, server):
    """The stall as reported: with a stream per tab, six tabs fill the browser's six connections
    to the server and a click's PATCH waits, never sent. Shared, the click answers at once."""
    api("PATCH", "/queues/lane", {"paused": True})
    driver = page.driver
    page.open("/queues")
    try:
        for _ in range(5):
            driver.switch_to.new_window("tab")
            page.open("/queues")
        page.wait_live()
        resume = page.wait_find('tr[data-queue="lane"] button.pause')
        assert resume.text == "Resume"
        resume.click()
        promptly(lambda: not api("GET", "/queues/lane")["paused"], "Resume to reach the server")
        assert server.event_streams() == 1
    finally:
        for tab in driver.window_handles[1:]:
            driver.switch_to.window(tab)
            driver.close()
        driver.switch_to.window(driver.window_handles[0])
