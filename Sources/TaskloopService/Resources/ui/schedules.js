// Schedules: the list (name, cron, timezone, active, paused or ended, next run, last run's state)
// and one schedule's page (its fields, next runs, last runs linked to their task or workflow, pause or
// resume, trigger, delete). `schedule.updated` events redraw a schedule at once; a run's state
// is read when the schedule is, so a task or workflow event of one of its runs re-reads it.

import { call, get, follow, ApiError } from './api.js';
import { h, fill, badge, formatTime, jsonBlock, toast, confirmButton, adminOnly } from './dom.js';

const path = (id) => `/schedules/${encodeURIComponent(id)}`;
const when = (iso) => (iso ? h('time', { datetime: iso }, formatTime(iso)) : '—');
const newest = (schedule) => schedule.last_runs[schedule.last_runs.length - 1];
/** Active, paused, deleted, or ended: no slot is left before its end_at (the API's next_runs are none). */
const statusOf = (schedule) => (schedule.deleted ? 'deleted' : schedule.paused ? 'paused' : schedule.next_runs.length ? 'active' : 'ended');

function runTarget(run) {
  if (run.task_id) return h('a', { href: `#/tasks/${encodeURIComponent(run.task_id)}` }, run.task_id);
  if (run.workflow_id) return h('a', { href: `#/workflows/${encodeURIComponent(run.workflow_id)}` }, run.workflow_id);
  return '—';
}

/** The run (task or workflow id) a task or workflow event may be about: a workflow's tasks are its run's. */
const runOf = (data) => (data.task ? data.task.workflow || data.task.id : data.workflow?.id);

/** Collects calls within `ms` into one: `later(key)` runs `work(keys)` once for all of them. */
function coalesce(ms, work) {
  const keys = new Set();
  let timer = null;
  return {
    later(key) {
      keys.add(key);
      timer ??= setTimeout(() => { timer = null; const batch = [...keys]; keys.clear(); work(batch); }, ms);
    },
    stop() { clearTimeout(timer); },
  };
}

export async function mount(view, target) {
  return target.id ? mountOne(view, target.id) : mountList(view);
}

async function mountList(view) {
  const rows = new Map();
  /** Run id (task or workflow) of each schedule's newest run -> the schedule's id. */
  const runs = new Map();
  const body = h('tbody');
  const empty = h('p', { class: 'muted' }, 'No schedules. Create one with POST /schedules or `taskloop schedule create`.');
  fill(view, h('h1', {}, 'Schedules'), h('table', { class: 'schedules' },
    h('caption', { class: 'visually-hidden' }, 'Schedules'),
    h('thead', {}, h('tr', {}, ['Name', 'Cron', 'Timezone', 'Status', 'Next run', 'Last run'].map((name) => h('th', { scope: 'col' }, name)))),
    body), empty);

  function render(schedule) {
    let row = rows.get(schedule.id);
    if (schedule.deleted) {
      row?.element.remove();
      rows.delete(schedule.id);
    } else {
      if (!row) {
        row = makeRow(schedule.id);
        rows.set(schedule.id, row);
      }
      row.update(schedule);
      // By name, then id: a redraw keeps the order.
      const order = [...rows.values()].sort((a, b) => a.key.localeCompare(b.key));
      body.insertBefore(row.element, order[order.indexOf(row) + 1]?.element || null);
    }
    for (const [run, id] of runs) if (id === schedule.id) runs.delete(run);
    const last = !schedule.deleted && newest(schedule);
    if (last && (last.task_id || last.workflow_id)) runs.set(last.task_id || last.workflow_id, schedule.id);
    empty.hidden = rows.size > 0;
  }

  function makeRow(id) {
    const name = h('a', { href: `#${path(id)}` });
    const cells = [h('td', { class: 'cron' }), h('td'), h('td'), h('td'), h('td')];
    const element = h('tr', { class: 'schedule', dataset: { id } }, h('th', { scope: 'row' }, name), cells);
    const row = {
      element, key: '',
      update(schedule) {
        row.key = `${schedule.name}\u0000${id}`;
        name.textContent = schedule.name;
        element.dataset.paused = schedule.paused;
        const last = newest(schedule);
        fill(cells[0], h('code', {}, schedule.cron));
        fill(cells[1], schedule.timezone);
        const status = statusOf(schedule);
        fill(cells[2], h('span', { class: `badge ${status}` }, status));
        fill(cells[3], when(schedule.next_runs[0]));
        fill(cells[4], last ? [badge(last.state), ' ', when(last.slot)] : '—');
      },
    };
    return row;
  }

  const reread = coalesce(300, (ids) => ids.forEach(async (id) => {
    try {
      render((await get(path(id))).json);
    } catch (error) {
      if (!(error instanceof ApiError)) throw error;
    }
  }));
  async function relist() {
    const { json } = await get('/schedules');
    for (const id of [...rows.keys()]) if (!json.schedules.some((schedule) => schedule.id === id)) render({ id, deleted: true });
    for (const schedule of json.schedules) render(schedule);
  }

  const { json, headers } = await get('/schedules');
  for (const schedule of json.schedules) render(schedule);
  const stream = follow({ types: 'schedule.updated,task.state,workflow.state' }, headers.get('Event-Seq'), (type, data) => {
    if (type === 'schedule.updated') render(data.schedule);
    else if (runs.has(runOf(data))) reread.later(runs.get(runOf(data)));
  }, () => relist().catch(() => null));
  // No timer: each slot that comes (run or skipped) is a `schedule.updated` with the next runs,
  // and the last before end_at comes with none (the schedule has ended).
  return () => {
    stream.stop();
    reread.stop();
  };
}

async function mountOne(view, id) {
  let schedule = null;
  let runs = new Set();
  const title = h('h1');
  const status = h('span');
  const facts = h('dl', { class: 'facts' });
  const next = h('ol', { class: 'next-runs' });
  const lastBody = h('tbody');
  const template = h('div');

  async function change(body, done) {
    try {
      render((await call('PATCH', path(id), body)).json);
      toast(`${schedule.name}: ${done}`);
    } catch (error) {
      toast(`${schedule.name}: ${error.message}`, 'error');
    }
  }
  const pause = adminOnly(h('button', { type: 'button', class: 'pause', onclick: () =>
    change({ paused: !schedule.paused }, schedule.paused ? 'resumed' : 'paused') }));
  const trigger = adminOnly(h('button', { type: 'button', class: 'trigger', onclick: async () => {
    try {
      const { json } = await call('POST', `${path(id)}/trigger`);
      toast(`${schedule.name}: run ${json.id} made`);
      reread.later(id);
    } catch (error) {
      toast(`${schedule.name}: ${error.message}`, 'error');
    }
  } }, 'Run now'));
  const remove = adminOnly(confirmButton('Delete', 'Confirm: delete', async () => {
    try {
      await call('DELETE', path(id));
      toast(`${schedule.name}: deleted; its runs are left alone`);
      location.hash = '#/schedules';
    } catch (error) {
      toast(`${schedule.name}: ${error.message}`, 'error');
    }
  }, { class: 'danger delete', 'aria-label': 'Delete this schedule' }));

  function row(term, ...value) {
    return [h('dt', {}, term), h('dd', {}, ...value)];
  }

  function render(latest) {
    schedule = latest;
    runs = new Set(schedule.last_runs.map((run) => run.task_id || run.workflow_id).filter(Boolean));
    title.textContent = schedule.name;
    document.title = `${schedule.name} · Taskloop`;
    const state = statusOf(schedule);
    fill(status, h('span', { class: `badge ${state === 'deleted' ? 'paused' : state}`, dataset: { state } }, state));
    pause.textContent = schedule.paused ? 'Resume' : 'Pause';
    pause.hidden = trigger.hidden = remove.hidden = Boolean(schedule.deleted);
    fill(facts,
      row('Id', h('span', { class: 'id' }, schedule.id)),
      row('Cron', h('code', {}, schedule.cron)),
      row('Timezone', schedule.timezone),
      row('Runs', schedule.task ? 'a task' : 'a workflow'),
      row('Overlap', schedule.overlap),
      row('Catch-up', schedule.catchup === 'all' ? `all (at most ${schedule.max_catchup})` : schedule.catchup),
      row('Jitter', schedule.jitter_ms ? `${schedule.jitter_ms} ms` : 'none'),
      row('Starts', when(schedule.start_at)),
      row('Ends', when(schedule.end_at)),
      row('Created', when(schedule.created_at)),
      row('Changed', when(schedule.updated_at)));
    fill(next, schedule.next_runs.length ? schedule.next_runs.map((slot) => h('li', {}, when(slot)))
      : h('li', { class: 'muted' }, schedule.deleted ? 'Deleted: no more runs.' : schedule.paused ? 'None while paused.' : 'None: the schedule has ended.'));
    fill(lastBody, schedule.last_runs.length ? [...schedule.last_runs].reverse().map((run) =>
      h('tr', { class: 'run', dataset: { state: run.state } },
        h('td', {}, when(run.slot)), h('td', {}, when(run.at)), h('td', {}, runTarget(run)),
        h('td', {}, badge(run.state)), h('td', {}, run.error || '')))
      : h('tr', {}, h('td', { colspan: 5, class: 'muted' }, 'No runs yet.')));
    fill(template, jsonBlock(schedule.task || schedule.workflow, 'What each run submits'));
  }

  const reread = coalesce(300, async () => {
    try {
      render((await get(path(id))).json);
    } catch (error) {
      if (!(error instanceof ApiError)) throw error;
      if (error.status === 404) render({ ...schedule, deleted: true, next_runs: [] });
    }
  });
  const stream = follow({ types: 'schedule.updated,task.state,workflow.state' }, undefined, (type, data) => {
    if (type === 'schedule.updated' ? data.schedule.id === id : runs.has(runOf(data))) reread.later(id);
  }, () => reread.later(id));
  const stop = () => { stream.stop(); reread.stop(); };
  try {
    render((await get(path(id))).json);
  } catch (error) {
    stop();
    throw error;
  }

  fill(view,
    h('nav', { class: 'crumbs', 'aria-label': 'Breadcrumb' }, h('a', { href: '#/schedules' }, 'Schedules'), ' / ', h('span', { class: 'id' }, id)),
    h('div', { class: 'heading' }, title, status, h('div', { class: 'actions' }, pause, trigger, remove)),
    h('div', { class: 'columns' },
      h('section', { class: 'card', 'aria-labelledby': 'schedule-title' }, h('h2', { id: 'schedule-title' }, 'Schedule'), facts),
      h('section', { class: 'card', 'aria-labelledby': 'next-title' }, h('h2', { id: 'next-title' }, 'Next runs'), next)),
    h('section', { class: 'card', 'aria-labelledby': 'last-title' }, h('h2', { id: 'last-title' }, 'Last runs'),
      h('table', { class: 'runs' },
        h('thead', {}, h('tr', {}, ['Slot', 'Made at', 'Task or workflow', 'State', 'Error'].map((name) => h('th', { scope: 'col' }, name)))),
        lastBody)),
    h('section', { class: 'card', 'aria-labelledby': 'template-title' }, h('h2', { id: 'template-title' }, 'What each run submits'), template));
  return stop;
}
