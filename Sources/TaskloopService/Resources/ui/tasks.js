// Tasks: a filtered table, newest first, paged by cursor as it scrolls, live from the event
// stream. Only the rows in view exist in the document (a 10,000-task table costs the same to
// draw as a 30-task one); rows are keyed by task id and patched, so focus and selection survive
// updates. Bulk cancel and retry act on the selection.

import { get, follow, query, actOnTask, outcome, refusal } from './api.js';
import { h, fill, adminOnly, STATES, TERMINAL, RETRYABLE, badge, progressBar, setProgress, formatTime, formatDuration, runTime, taskLabel, toast, inBatches } from './dom.js';

const ROW_HEIGHT = 44;
const OVERSCAN = 10;
const FIRST_PAGE = 200;
const NEXT_PAGE = 500;
const FILTERS = ['state', 'queue', 'workflow', 'kind', 'name'];
const KINDS = ['noop', 'sleep', 'external', 'http', 'exec'];

/** Index of `id` in `tasks` (sorted by id, descending), or where it would go. */
function position(tasks, id) {
  let low = 0;
  let high = tasks.length;
  while (low < high) {
    const middle = (low + high) >> 1;
    if (tasks[middle].id > id) low = middle + 1; else high = middle;
  }
  return low;
}

function matches(task, filters) {
  if (filters.state && task.state !== filters.state) return false;
  if (filters.queue && task.queue !== filters.queue) return false;
  if (filters.workflow && task.workflow !== filters.workflow) return false;
  if (filters.kind && task.kind !== filters.kind) return false;
  if (filters.name && !(task.name || '').toLowerCase().includes(filters.name.toLowerCase())) return false;
  return true;
}

export async function mount(view, target) {
  let filters = Object.fromEntries(FILTERS.filter((name) => target.query[name]).map((name) => [name, target.query[name]]));
  let tasks = [];
  let next = null;
  let loadingMore = false;
  let stream = null;
  let generation = 0;
  const selected = new Set();
  const rows = new Map();

  // Filters
  const stateSelect = h('select', { name: 'state', id: 'filter-state' },
    h('option', { value: '' }, 'any state'), STATES.map((state) => h('option', { value: state }, state)));
  const queueSelect = h('select', { name: 'queue', id: 'filter-queue' }, h('option', { value: '' }, 'any queue'));
  const kindInput = h('input', { name: 'kind', id: 'filter-kind', list: 'kinds', placeholder: 'any kind', autocomplete: 'off', size: 10 });
  const workflowInput = h('input', { name: 'workflow', id: 'filter-workflow', placeholder: 'any workflow', autocomplete: 'off', spellcheck: 'false', size: 14 });
  const nameInput = h('input', { name: 'name', id: 'filter-name', type: 'search', placeholder: 'text in name', autocomplete: 'off', size: 16 });
  const inputs = { state: stateSelect, queue: queueSelect, kind: kindInput, workflow: workflowInput, name: nameInput };
  const form = h('form', { class: 'filters', role: 'search', 'aria-label': 'Filter tasks', onsubmit: (event) => { event.preventDefault(); applyFilters(); } },
    h('label', { for: 'filter-state' }, 'State'), stateSelect,
    h('label', { for: 'filter-queue' }, 'Queue'), queueSelect,
    h('label', { for: 'filter-kind' }, 'Kind'), kindInput,
    h('datalist', { id: 'kinds' }, KINDS.map((kind) => h('option', { value: kind }))),
    h('label', { for: 'filter-workflow' }, 'Workflow'), workflowInput,
    h('label', { for: 'filter-name' }, 'Name'), nameInput,
    h('button', { type: 'submit' }, 'Filter'),
    h('button', { type: 'button', onclick: () => { for (const input of Object.values(inputs)) input.value = ''; applyFilters(); } }, 'Clear'));
  let typing = null;
  form.addEventListener('change', () => applyFilters());
  nameInput.addEventListener('input', () => { clearTimeout(typing); typing = setTimeout(applyFilters, 300); });

  // Bulk actions
  const selectionText = h('span', { class: 'selection', 'aria-live': 'polite' });
  const bulkCancel = adminOnly(h('button', { type: 'button', class: 'danger', onclick: () => bulk('cancel') }, 'Cancel selected'));
  const bulkRetry = adminOnly(h('button', { type: 'button', onclick: () => bulk('retry') }, 'Retry selected'));
  const bulkClear = h('button', { type: 'button', onclick: () => { selected.clear(); selectionChanged(); } }, 'Clear selection');
  const bulkBar = h('div', { class: 'bulk', role: 'toolbar', 'aria-label': 'Selected tasks' }, selectionText, bulkCancel, bulkRetry, bulkClear);

  // Table
  const selectAll = h('input', { type: 'checkbox', 'aria-label': 'Select every loaded task', onchange: () => {
    if (selectAll.checked) for (const task of tasks) selected.add(task.id); else selected.clear();
    selectionChanged();
  } });
  const topSpacer = h('tr', { class: 'spacer', 'aria-hidden': 'true' }, h('td', { colspan: 10 }));
  const bottomSpacer = h('tr', { class: 'spacer', 'aria-hidden': 'true' }, h('td', { colspan: 10 }));
  const empty = h('tr', { class: 'empty' }, h('td', { colspan: 10 }, 'No tasks match these filters.'));
  const body = h('tbody', {}, topSpacer, bottomSpacer);
  const table = h('table', { class: 'tasks', 'aria-label': 'Tasks, newest first' },
    h('thead', {}, h('tr', { 'aria-rowindex': 1 },
      h('th', { scope: 'col', class: 'select' }, selectAll),
      h('th', { scope: 'col', class: 'name' }, 'Task'),
      h('th', { scope: 'col' }, 'Kind'),
      h('th', { scope: 'col' }, 'Queue'),
      h('th', { scope: 'col', class: 'state' }, 'State'),
      h('th', { scope: 'col', class: 'progress' }, 'Progress'),
      h('th', { scope: 'col' }, 'Attempt'),
      h('th', { scope: 'col' }, 'Created'),
      h('th', { scope: 'col' }, 'Run time'),
      h('th', { scope: 'col' }, h('span', { class: 'visually-hidden' }, 'Actions')))),
    body);
  const scroller = h('div', { class: 'scroller', role: 'region', tabindex: 0, 'aria-label': 'Task table' }, table);
  const status = h('p', { class: 'status muted', 'aria-live': 'polite' });
  fill(view, h('div', { class: 'heading' }, h('h1', {}, 'Tasks'), status), form, bulkBar, scroller);

  for (const [name, input] of Object.entries(inputs)) input.value = filters[name] || '';

  async function loadQueues() {
    const { json } = await get('/queues');
    const current = queueSelect.value || filters.queue || '';
    fill(queueSelect, h('option', { value: '' }, 'any queue'), json.queues.map((queue) => h('option', { value: queue.name }, queue.name)));
    if (current && !json.queues.some((queue) => queue.name === current)) queueSelect.append(h('option', { value: current }, current));
    queueSelect.value = current;
  }

  function applyFilters() {
    clearTimeout(typing);
    const wanted = {};
    for (const [name, input] of Object.entries(inputs)) if (input.value.trim()) wanted[name] = input.value.trim();
    if (JSON.stringify(wanted) === JSON.stringify(filters)) return;
    filters = wanted;
    history.replaceState(null, '', `#/tasks${query(filters)}`);
    load();
  }

  // Rows
  function makeRow(id) {
    const checkbox = h('input', { type: 'checkbox', onchange: () => {
      if (checkbox.checked) selected.add(id); else selected.delete(id);
      selectionChanged();
    } });
    const link = h('a', { href: `#/tasks/${encodeURIComponent(id)}` });
    const idText = h('span', { class: 'id' }, id);
    const kind = h('td');
    const queue = h('td');
    const state = h('td', { class: 'state' });
    const bar = progressBar(null);
    const message = h('span', { class: 'message' });
    const attempt = h('td', { class: 'number' });
    const created = h('td', { class: 'time' });
    const duration = h('td', { class: 'number' });
    const cancel = adminOnly(h('button', { type: 'button', class: 'danger small', onclick: () => act('cancel', row.task) }, 'Cancel'));
    const retry = adminOnly(h('button', { type: 'button', class: 'small', onclick: () => act('retry', row.task) }, 'Retry'));
    const element = h('tr', { class: 'task', dataset: { id } },
      h('td', { class: 'select' }, checkbox),
      h('td', { class: 'name' }, link, idText),
      kind, queue, state,
      h('td', { class: 'progress' }, bar, message),
      attempt, created, duration,
      h('td', { class: 'actions' }, cancel, retry));
    const row = {
      element,
      task: null,
      update(task, index) {
        element.setAttribute('aria-rowindex', index + 2);
        checkbox.checked = selected.has(id);
        if (row.task === task) return;
        row.task = task;
        const label = taskLabel(task);
        link.textContent = label;
        checkbox.setAttribute('aria-label', `Select ${label}`);
        kind.textContent = task.kind;
        queue.textContent = task.queue;
        element.dataset.state = task.state;
        fill(state, badge(task.state, task.cancel_requested));
        setProgress(bar, task.state === 'succeeded' ? 1 : task.progress.fraction);
        bar.dataset.state = task.state;
        bar.setAttribute('aria-label', `Progress of ${label}`);
        message.textContent = task.state === 'scheduled' ? `runs ${formatTime(task.scheduled_for)}`
          : task.progress.message || (task.error ? task.error.message : '');
        message.title = task.state === 'scheduled' ? task.scheduled_for : '';
        attempt.textContent = `${task.attempt}/${task.max_attempts}`;
        created.textContent = formatTime(task.created_at);
        created.title = task.created_at;
        duration.textContent = formatDuration(runTime(task));
        cancel.hidden = TERMINAL.has(task.state) || task.cancel_requested;
        cancel.setAttribute('aria-label', `Cancel ${label}`);
        retry.hidden = !RETRYABLE.has(task.state);
        retry.setAttribute('aria-label', `Retry ${label}`);
      },
      tick() {
        if (row.task?.state === 'running') duration.textContent = formatDuration(runTime(row.task));
      },
    };
    return row;
  }

  let frame = null;
  function scheduleRender() {
    if (frame === null) frame = requestAnimationFrame(() => { frame = null; render(); });
  }

  function render() {
    const headHeight = table.tHead.offsetHeight;
    const top = Math.max(0, scroller.scrollTop - headHeight);
    const first = Math.max(0, Math.floor(top / ROW_HEIGHT) - OVERSCAN);
    const last = Math.min(tasks.length, Math.ceil((top + scroller.clientHeight) / ROW_HEIGHT) + OVERSCAN);
    topSpacer.firstChild.style.height = `${first * ROW_HEIGHT}px`;
    bottomSpacer.firstChild.style.height = `${(tasks.length - last) * ROW_HEIGHT}px`;
    topSpacer.hidden = first === 0;
    bottomSpacer.hidden = last === tasks.length;
    const visible = new Set();
    for (let index = first; index < last; index++) visible.add(tasks[index].id);
    for (const [id, row] of rows) {
      if (!visible.has(id)) { row.element.remove(); rows.delete(id); }
    }
    let cursor = topSpacer.nextSibling;
    for (let index = first; index < last; index++) {
      const task = tasks[index];
      let row = rows.get(task.id);
      if (!row) { row = makeRow(task.id); rows.set(task.id, row); }
      row.update(task, index);
      if (row.element === cursor) cursor = cursor.nextSibling; else body.insertBefore(row.element, cursor);
    }
    if (tasks.length === 0) body.insertBefore(empty, bottomSpacer); else empty.remove();
    table.setAttribute('aria-rowcount', next ? -1 : tasks.length + 1);
    status.textContent = tasks.length === 0 ? '' : `${tasks.length.toLocaleString()} ${next ? 'loaded; more as you scroll' : 'tasks'}`;
    if (next && !loadingMore && last >= tasks.length - OVERSCAN * 4) loadMore();
  }

  function selectionChanged() {
    const count = selected.size;
    selectionText.textContent = count ? `${count} selected` : 'Nothing selected';
    bulkCancel.disabled = bulkRetry.disabled = count === 0 || refusal() !== null;
    bulkClear.disabled = count === 0;
    selectAll.checked = count > 0 && count >= tasks.length;
    selectAll.indeterminate = count > 0 && count < tasks.length;
    for (const [id, row] of rows) row.element.querySelector('.select input').checked = selected.has(id);
  }

  function put(task) {
    const index = position(tasks, task.id);
    if (tasks[index]?.id === task.id) {
      tasks[index] = task;
    } else {
      // A task not listed: shown if it belongs here, and only within the loaded range (the
      // rest arrives with its page).
      if (!matches(task, filters) || (next && index >= tasks.length)) return;
      tasks.splice(index, 0, task);
    }
    scheduleRender();
  }

  async function act(action, task) {
    try {
      const answer = await actOnTask(action, task.id);
      put(answer);
      toast(`${taskLabel(answer)}: ${outcome(action, answer)}`);
    } catch (error) {
      toast(`${taskLabel(task)}: ${error.message}`, 'error');
    }
  }

  async function bulk(action) {
    const chosen = tasks.filter((task) => selected.has(task.id)
      && (action === 'cancel' ? !TERMINAL.has(task.state) : RETRYABLE.has(task.state)));
    const skipped = selected.size - chosen.length;
    if (chosen.length === 0) {
      toast(action === 'cancel' ? 'No selected task is unfinished.' : 'No selected task failed or was cancelled.', 'error');
      return;
    }
    bulkCancel.disabled = bulkRetry.disabled = true;
    const outcomes = await inBatches(chosen, 8, async (task) => put(await actOnTask(action, task.id)));
    const refused = outcomes.filter((outcome) => !outcome.ok);
    const done = outcomes.length - refused.length;
    const verb = action === 'cancel' ? 'cancelled' : 'retried';
    toast(`${done} ${verb}${refused.length ? `, ${refused.length} refused (${refused[0].error.message})` : ''}${skipped ? `, ${skipped} skipped` : ''}`,
      refused.length ? 'error' : 'info');
    selected.clear();
    selectionChanged();
  }

  async function load() {
    const mine = ++generation;
    stream?.stop();
    stream = null;
    status.textContent = 'Loading…';
    const { json, headers } = await get(`/tasks${query({ ...filters, limit: FIRST_PAGE })}`);
    if (mine !== generation) return;
    tasks = json.tasks;
    next = json.next;
    selected.clear();
    for (const row of rows.values()) row.element.remove();
    rows.clear();
    scroller.scrollTop = 0;
    selectionChanged();
    render();
    const since = headers.get('Event-Seq');
    const serverFilters = { queue: filters.queue, workflow: filters.workflow, types: 'task.created,task.state,task.progress' };
    stream = follow(serverFilters, since, (type, data) => { if (data.task) put(data.task); }, () => load());
  }

  async function loadMore() {
    loadingMore = true;
    const mine = generation;
    try {
      const { json } = await get(`/tasks${query({ ...filters, limit: NEXT_PAGE, after: next })}`);
      if (mine !== generation) return;
      for (const task of json.tasks) {
        const index = position(tasks, task.id);
        if (tasks[index]?.id !== task.id) tasks.splice(index, 0, task);
      }
      next = json.next;
      selectionChanged();
      scheduleRender();
    } catch (error) {
      toast(`Loading more tasks: ${error.message}`, 'error');
    } finally {
      loadingMore = false;
    }
  }

  scroller.addEventListener('scroll', scheduleRender, { passive: true });
  const resize = new ResizeObserver(scheduleRender);
  resize.observe(scroller);
  const ticker = setInterval(() => { for (const row of rows.values()) row.tick(); }, 1000);

  await Promise.all([loadQueues(), load()]);
  return () => {
    generation++;
    stream?.stop();
    resize.disconnect();
    clearInterval(ticker);
    clearTimeout(typing);
    if (frame !== null) cancelAnimationFrame(frame);
  };
}
