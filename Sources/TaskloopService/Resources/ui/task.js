// One task: what it was asked to do and what came of it, its timings and attempts, its
// dependencies and dependents, its lease, and its history from the server's event buffer
// (GET /events?task=ID&since=0, which then goes on live).

import { get, follow, query, actOnTask, outcome } from './api.js';
import { h, fill, adminOnly, TERMINAL, RETRYABLE, badge, progressBar, setProgress, formatTime, formatDuration, runTime, taskLabel, jsonBlock, toast } from './dom.js';

function row(term, ...value) {
  return [h('dt', {}, term), h('dd', {}, ...value)];
}

function taskLink(id, task) {
  return h('li', {}, h('a', { href: `#/tasks/${encodeURIComponent(id)}` }, task ? taskLabel(task) : id),
    task ? [' ', badge(task.state)] : null, h('span', { class: 'id' }, id));
}

/** Attempts as the event history shows them: each run's start, end, outcome and error. */
function attemptsFrom(events) {
  const attempts = new Map();
  for (const event of events) {
    if (event.type !== 'task.state') continue;
    const task = event.task;
    const attempt = attempts.get(task.attempt) || { number: task.attempt, started: null, finished: null, state: null, error: null };
    if (task.state === 'running' && !attempt.started) attempt.started = task.started_at || event.time;
    if (TERMINAL.has(task.state)) {
      attempt.finished = task.finished_at || event.time;
      attempt.state = task.state;
      attempt.error = task.error;
    } else if (task.state === 'queued' && attempt.started && !attempt.finished) {
      // Back in the queue without finishing: a released lease or a retry's backoff.
      attempt.state = 'queued again';
      attempt.error = task.error;
    }
    attempts.set(task.attempt, attempt);
  }
  return [...attempts.values()];
}

function describe(event) {
  const task = event.task;
  if (event.type === 'task.created') return `created (${task.state})`;
  if (event.type === 'task.progress') {
    const fraction = task.progress.fraction === null ? '' : `${Math.round(task.progress.fraction * 100)}%`;
    return `progress ${fraction} ${task.progress.message || ''}`.trim();
  }
  let text = task.cancel_requested && task.state === 'running' ? 'cancel requested' : task.state;
  if (task.error && TERMINAL.has(task.state)) text += ` — ${task.error.code}: ${task.error.message}`;
  return `${text} (attempt ${task.attempt})`;
}

export async function mount(view, target) {
  const id = target.id;
  let task = (await get(`/tasks/${encodeURIComponent(id)}`)).json;
  const history = [];
  let historyTrimmed = false;

  const title = h('h1');
  const stateBadge = h('span');
  const cancel = adminOnly(h('button', { type: 'button', class: 'danger', onclick: () => act('cancel') }, 'Cancel'));
  const retry = adminOnly(h('button', { type: 'button', onclick: () => act('retry') }, 'Retry'));
  const bar = progressBar(null, 'Progress');
  const progressText = h('p', { class: 'message' });
  const summary = h('dl', { class: 'facts' });
  const timings = h('dl', { class: 'facts' });
  const ranFor = h('span');
  const lease = h('section', { 'aria-labelledby': 'lease-title' });
  const dependencies = h('ul', { class: 'links' });
  const dependents = h('ul', { class: 'links' });
  const params = h('div');
  const result = h('div');
  const error = h('div');
  const metadata = h('div');
  const details = h('div');
  const attemptsBody = h('tbody');
  const historyList = h('ol', { class: 'history', 'aria-live': 'off' });
  const historyNote = h('p', { class: 'muted' });

  fill(view,
    h('nav', { class: 'crumbs', 'aria-label': 'Breadcrumb' }, h('a', { href: '#/tasks' }, 'Tasks'), ' / ', h('span', { class: 'id' }, id)),
    h('div', { class: 'heading' }, title, stateBadge, h('div', { class: 'actions' }, cancel, retry)),
    h('section', { class: 'card', 'aria-labelledby': 'progress-title' },
      h('h2', { id: 'progress-title' }, 'Progress'), bar, progressText, details),
    h('div', { class: 'columns' },
      h('section', { class: 'card', 'aria-labelledby': 'summary-title' }, h('h2', { id: 'summary-title' }, 'Task'), summary),
      h('section', { class: 'card', 'aria-labelledby': 'timings-title' }, h('h2', { id: 'timings-title' }, 'Timings'), timings)),
    h('section', { class: 'card' }, lease),
    h('div', { class: 'columns' },
      h('section', { class: 'card', 'aria-labelledby': 'deps-title' }, h('h2', { id: 'deps-title' }, 'Depends on'), dependencies),
      h('section', { class: 'card', 'aria-labelledby': 'dependents-title' }, h('h2', { id: 'dependents-title' }, 'Dependents'), dependents)),
    h('div', { class: 'columns' },
      h('section', { class: 'card', 'aria-labelledby': 'params-title' }, h('h2', { id: 'params-title' }, 'Params'), params),
      h('section', { class: 'card', 'aria-labelledby': 'result-title' }, h('h2', { id: 'result-title' }, 'Result'), result)),
    h('div', { class: 'columns' },
      h('section', { class: 'card', 'aria-labelledby': 'error-title' }, h('h2', { id: 'error-title' }, 'Error'), error),
      h('section', { class: 'card', 'aria-labelledby': 'metadata-title' }, h('h2', { id: 'metadata-title' }, 'Metadata'), metadata)),
    h('section', { class: 'card', 'aria-labelledby': 'attempts-title' }, h('h2', { id: 'attempts-title' }, 'Attempts'),
      h('table', { class: 'attempts' },
        h('thead', {}, h('tr', {}, ['Attempt', 'Started', 'Finished', 'Ran for', 'Outcome', 'Error'].map((name) => h('th', { scope: 'col' }, name)))),
        attemptsBody)),
    h('section', { class: 'card', 'aria-labelledby': 'history-title' }, h('h2', { id: 'history-title' }, 'Event history'), historyNote, historyList));

  function render() {
    const label = taskLabel(task);
    title.textContent = label;
    document.title = `${label} · Taskloop`;
    fill(stateBadge, badge(task.state, task.cancel_requested));
    cancel.hidden = TERMINAL.has(task.state) || task.cancel_requested;
    retry.hidden = !RETRYABLE.has(task.state);
    setProgress(bar, task.state === 'succeeded' ? 1 : task.progress.fraction);
    bar.dataset.state = task.state;
    progressText.textContent = task.state === 'scheduled' ? `Scheduled for ${formatTime(task.scheduled_for)}`
      : task.progress.message || (task.state === 'running' ? 'Running' : task.state);
    fill(details, task.progress.details ? jsonBlock(task.progress.details, 'Progress details') : null);
    fill(summary,
      row('Id', h('span', { class: 'id' }, task.id)),
      row('Kind', task.kind),
      row('Queue', h('a', { href: `#/tasks${query({ queue: task.queue })}` }, task.queue)),
      row('Priority', task.priority),
      row('Concurrency key', task.concurrency_key ?? '—'),
      row('Attempt', `${task.attempt} of ${task.max_attempts}`),
      row('Retry', `backoff ${formatDuration(task.retry.backoff_ms)} × ${task.retry.backoff_factor}`),
      row('Timeout', task.timeout_ms ? formatDuration(task.timeout_ms) : 'none'),
      row('On dependency failure', task.on_dependency_failure),
      row('Workflow', task.workflow ? h('a', { href: `#/workflows/${encodeURIComponent(task.workflow)}` }, task.workflow) : '—'),
      row('Schedule', task.schedule ? h('a', { class: 'schedule', href: `#/schedules/${encodeURIComponent(task.schedule.id)}` },
        `run of ${formatTime(task.schedule.slot)}`) : '—'));
    ranFor.textContent = formatDuration(runTime(task));
    const waited = task.started_at ? Date.parse(task.started_at) - Date.parse(task.created_at) : null;
    fill(timings,
      row('Created', h('time', { datetime: task.created_at }, formatTime(task.created_at))),
      row('Scheduled for', task.scheduled_for ? h('time', { datetime: task.scheduled_for }, formatTime(task.scheduled_for)) : '—'),
      row('Expires', task.expires_at ? h('time', { datetime: task.expires_at }, formatTime(task.expires_at)) : '—'),
      row('Started', task.started_at ? h('time', { datetime: task.started_at }, formatTime(task.started_at)) : '—'),
      row('Finished', task.finished_at ? h('time', { datetime: task.finished_at }, formatTime(task.finished_at)) : '—'),
      row('Waited', formatDuration(waited)),
      row('Ran for', ranFor),
      row('Last progress', task.progress.updated_at ? formatTime(task.progress.updated_at) : '—'));
    fill(lease, h('h2', { id: 'lease-title' }, 'Lease'), task.lease
      ? h('dl', { class: 'facts' }, row('Worker', task.lease.worker),
        row('Expires', h('time', { datetime: task.lease.expires_at }, formatTime(task.lease.expires_at))))
      : h('p', { class: 'muted' }, 'Not leased by a worker.'));
    fill(params, jsonBlock(task.params, 'Params'));
    fill(result, jsonBlock(task.result, 'Result'));
    fill(error, task.error ? h('div', { class: 'error-box' }, h('strong', {}, task.error.code), ': ', task.error.message, jsonBlock(task.error, 'Error')) : h('p', { class: 'muted' }, '—'));
    fill(metadata, jsonBlock(task.metadata, 'Metadata'));
  }

  async function renderDependencies() {
    const known = await Promise.all(task.dependencies.map((dependency) => get(`/tasks/${encodeURIComponent(dependency)}`).then(({ json }) => json, () => null)));
    fill(dependencies, task.dependencies.length
      ? task.dependencies.map((dependency, index) => taskLink(dependency, known[index]))
      : h('li', { class: 'muted' }, 'None'));
    const { json } = await get(`/tasks${query({ depends_on: task.id, limit: 1000 })}`);
    fill(dependents, json.tasks.length
      ? [json.tasks.map((dependent) => taskLink(dependent.id, dependent)), json.next ? h('li', { class: 'muted' }, 'and more') : null]
      : h('li', { class: 'muted' }, 'None'));
  }

  function renderHistory() {
    fill(attemptsBody, attemptsFrom(history).map((attempt) => h('tr', {},
      h('td', { class: 'number' }, attempt.number),
      h('td', {}, formatTime(attempt.started)),
      h('td', {}, formatTime(attempt.finished)),
      h('td', { class: 'number' }, attempt.started && attempt.finished ? formatDuration(Date.parse(attempt.finished) - Date.parse(attempt.started)) : '—'),
      h('td', {}, attempt.state ? badge(attempt.state) : 'running'),
      h('td', {}, attempt.error ? `${attempt.error.code}: ${attempt.error.message}` : '—'))));
    historyNote.textContent = historyTrimmed
      ? 'Older events are no longer kept by the server; the history starts later.'
      : history.length ? '' : 'No events kept for this task.';
  }

  let historyFrame = null;
  function historyChanged() {
    if (historyFrame === null) historyFrame = requestAnimationFrame(() => { historyFrame = null; render(); renderHistory(); });
  }

  async function act(action) {
    try {
      task = await actOnTask(action, id);
      render();
      toast(`${taskLabel(task)}: ${outcome(action, task)}`);
    } catch (failure) {
      toast(`${taskLabel(task)}: ${failure.message}`, 'error');
    }
  }

  render();
  renderHistory();
  renderDependencies();
  // The buffered history replays first (each event carries the task as it was then), so the
  // page settles on the latest; drawing once per frame keeps a long replay cheap.
  const stream = follow({ task: id }, '0', (type, data) => {
    history.push(data);
    historyList.append(h('li', {}, h('time', { datetime: data.time }, formatTime(data.time)), ' ', h('span', { class: `event ${type.replace('.', '-')}` }, describe(data))));
    task = data.task;
    historyChanged();
  }, () => { historyTrimmed = true; historyChanged(); });
  const ticker = setInterval(() => {
    if (task.state === 'running') ranFor.textContent = formatDuration(runTime(task));
  }, 1000);
  return () => {
    stream.stop();
    clearInterval(ticker);
    if (historyFrame !== null) cancelAnimationFrame(historyFrame);
  };
}
