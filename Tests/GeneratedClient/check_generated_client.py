"""A client generated from openapi.yaml by openapi-python-client reads every answer of a real
server: each call below must come back parsed into the spec's models, not `None` (which is
what a generated client gives for an answer its schema cannot describe). A worker's whole
cycle (lease, heartbeat, complete) is included: a spec the generator half-dropped once made
`lease_tasks` raise on every 200.

Usage: python check_generated_client.py GENERATED_DIR BASE_URL TOKEN
"""
import json
import sys

import jsonschema
import yaml

sys.path.insert(0, sys.argv[1])

from client import AuthenticatedClient  # noqa: E402
from client.api.queues import get_queue, list_queues, update_queue  # noqa: E402
from client.api.service import health, metrics, openapi, whoami  # noqa: E402
from client.api.tasks import cancel_task, get_task, list_tasks, retry_task, submit_task  # noqa: E402
from client.api.workers import heartbeat, lease_tasks  # noqa: E402
from client.api.tasks import complete_task  # noqa: E402
from client.api.workflows import get_workflow, submit_workflow  # noqa: E402
from client.models import (  # noqa: E402
    CompletionReport, Dispatch, ExternalTask, Heartbeat, LeaseCall, LeasedTask, NoopTask, NoopWorkflowTask,
    Queue, QueueUpdate, Retry, SleepParams, SleepTask, Task, TaskPage, Workflow, WorkflowSubmission,
)

base_url, token = sys.argv[2], sys.argv[3]
api = AuthenticatedClient(base_url=base_url, token=token, raise_on_unexpected_status=True)


def parsed(response, model, status=200):
    assert response.status_code == status, (response.status_code, response.content[:500])
    assert isinstance(response.parsed, model), (type(response.parsed), response.content[:500])
    return response.parsed


parsed(health.sync_detailed(client=api), object)
assert parsed(whoami.sync_detailed(client=api), object).role.value == "admin"
assert b"openapi" in openapi.sync_detailed(client=api).content
assert metrics.sync_detailed(client=api).status_code == 200

task = parsed(submit_task.sync_detailed(client=api, body=NoopTask(kind="noop", name="generated")), Task, 201)
parsed(get_task.sync_detailed(task.id, client=api), Task)
page = parsed(list_tasks.sync_detailed(client=api), TaskPage)
assert any(listed.id == task.id for listed in page.tasks)

sleeper = parsed(submit_task.sync_detailed(client=api, body=SleepTask(kind="sleep", params=SleepParams(duration_ms=60_000))),
                 Task, 201)
cancelled = cancel_task.sync_detailed(sleeper.id, client=api)
assert cancelled.status_code in (200, 202, 409) and cancelled.parsed is not None, cancelled.content

workflow = parsed(submit_workflow.sync_detailed(client=api, body=WorkflowSubmission(
    name="generated", tasks=[NoopWorkflowTask(key="a", kind="noop"), NoopWorkflowTask(key="b", kind="noop", dependencies=["a"])])),
    Workflow, 201)
parsed(get_workflow.sync_detailed(workflow.id, client=api), Workflow)

parsed(update_queue.sync_detailed("generated-workers", client=api, body=QueueUpdate(dispatch=Dispatch.WORKERS)), Queue)
parsed(list_queues.sync_detailed(client=api), object)
parsed(get_queue.sync_detailed("generated-workers", client=api), Queue)
external = parsed(submit_task.sync_detailed(client=api, body=ExternalTask(kind="external", queue="generated-workers")), Task, 201)
leased = parsed(lease_tasks.sync_detailed("generated-workers", client=api, body=LeaseCall(worker="generated")), object)
assert len(leased.tasks) == 1 and isinstance(leased.tasks[0], LeasedTask), leased
lease_token = leased.tasks[0].lease.token
assert isinstance(lease_token, str) and lease_token, leased.tasks[0].lease
parsed(heartbeat.sync_detailed(external.id, client=api, body=Heartbeat(lease_token=lease_token)), object)
done = parsed(complete_task.sync_detailed(external.id, client=api, body=CompletionReport(result={"ok": True}, lease_token=lease_token)), Task)
assert done.state.value == "succeeded", done.state

# Explicit retries raise max_attempts past the 100 a submission may ask for, and the answer's
# schema must still take it (schemathesis once found a retried task answered 101 against a
# schema capped at 100).
with open("openapi.yaml") as spec_file:
    spec = yaml.safe_load(spec_file)
task_schema = jsonschema.Draft202012Validator({"$ref": "#/components/schemas/Task", "components": spec["components"]})
parsed(update_queue.sync_detailed("generated-paused", client=api, body=QueueUpdate(paused=True)), Queue)
held = parsed(submit_task.sync_detailed(client=api, body=NoopTask(kind="noop", queue="generated-paused",
                                                                  retry=Retry(max_attempts=100))), Task, 201)
for _ in range(100):
    parsed(cancel_task.sync_detailed(held.id, client=api), Task)
    retried = retry_task.sync_detailed(held.id, client=api)
    parsed(retried, Task)
answered = json.loads(retried.content)
assert answered["attempt"] == 101 and answered["max_attempts"] == 101 and answered["retry"]["max_attempts"] == 101, answered
task_schema.validate(answered)
print("generated client: every answer read")
