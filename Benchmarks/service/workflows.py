"""Shared by the service benchmarks: submit a workflow and wait until it has succeeded."""
import re
import time


def run_workflow(connection, body: bytes) -> float:
    """Seconds from sending `body` to POST /workflows until GET /workflows/{id} says succeeded.

    The answers carry every task (megabytes for big workflows); the id and state come first,
    so they are read from the head instead of decoding all of it."""
    started = time.perf_counter()
    connection.request("POST", "/workflows", body, {"Content-Type": "application/json"})
    response = connection.getresponse()
    created = response.read()
    assert response.status == 201, (response.status, created[:300])
    workflow_id = re.match(rb'\{"id":"([0-9A-Z]{26})"', created).group(1).decode()
    while True:
        connection.request("GET", f"/workflows/{workflow_id}")
        answer = connection.getresponse()
        state = re.search(rb'"state":"([a-z]+)"', answer.read(400)).group(1).decode()
        answer.read()
        if state == "succeeded":
            return time.perf_counter() - started
        assert state == "running", state
        time.sleep(0.001)
