// Queues: counts by state, limit, cap per concurrency key and rate limit (editable), dispatch, pause/resume, cancel-all, and a sparkline
// of tasks finished per interval. `queue.updated` events replace a queue at once; task events
// refresh the counts at most once a second (a queue's counts change with every task).

import { call, get, follow, ApiError } from './api.js';
import { h, s, fill, STATES, toast, confirmButton, adminOnly } from './dom.js';

// "5/s, burst 10", or "none".
function describeRate(limit) {
  return limit ? `${limit.per_second}/s, burst ${limit.burst}` : 'none';
}

function sparkline(throughput) {
  const counts = throughput.finished;
  const width = 120;
  const height = 28;
  const max = Math.max(1, ...counts);
  const step = width / Math.max(1, counts.length - 1);
  const points = counts.map((count, index) => `${(index * step).toFixed(1)},${(height - 2 - (count / max) * (height - 4)).toFixed(1)}`);
  const sum = (list) => list.reduce((total, count) => total + count, 0);
  // The last minute's intervals, the current (still filling) one included.
  const lastMinute = sum(counts.slice(-Math.max(1, Math.round(60 / throughput.interval_seconds))));
  const minutes = Math.round((counts.length * throughput.interval_seconds) / 60);
  const label = `${sum(counts)} finished in the last ${minutes} minutes; ${lastMinute} in the last minute`;
  return h('div', { class: 'throughput' },
    s('svg', { class: 'sparkline', viewBox: `0 0 ${width} ${height}`, width, height, role: 'img', 'aria-label': label },
      s('polyline', { points: points.join(' '), fill: 'none' })),
    h('span', { class: 'rate' }, `${lastMinute}/min`));
}

export async function mount(view) {
  const rows = new Map();
  const body = h('tbody');
  const table = h('table', { class: 'queues' },
    h('caption', { class: 'visually-hidden' }, 'Queues'),
    h('thead', {}, h('tr', {},
      h('th', { scope: 'col' }, 'Queue'),
      h('th', { scope: 'col' }, 'Dispatch'),
      h('th', { scope: 'col' }, 'Limit'),
      h('th', { scope: 'col' }, 'Per key'),
      h('th', { scope: 'col' }, 'Rate limit'),
      h('th', { scope: 'col' }, 'Status'),
      STATES.map((state) => h('th', { scope: 'col', class: 'count' }, state)),
      h('th', { scope: 'col' }, 'Finished'),
      h('th', { scope: 'col' }, h('span', { class: 'visually-hidden' }, 'Actions')))),
    body);
  fill(view, h('h1', {}, 'Queues'), table);

  function render(queue) {
    let row = rows.get(queue.name);
    if (!row) {
      row = makeRow(queue.name);
      rows.set(queue.name, row);
      const after = [...rows.keys()].sort().indexOf(queue.name);
      body.insertBefore(row.element, body.children[after] || null);
    }
    row.update(queue);
  }

  function makeRow(name) {
    const limit = adminOnly(h('input', { type: 'number', min: 1, max: 10000, class: 'limit', 'aria-label': `Limit of ${name}`, name: 'max_concurrency' }));
    let dirty = false;
    limit.addEventListener('input', () => { dirty = true; });
    const save = adminOnly(h('button', { type: 'submit' }, 'Set'));
    const limitForm = h('form', { class: 'inline', onsubmit: async (event) => {
      event.preventDefault();
      const value = Number(limit.value);
      try {
        const { json } = await call('PATCH', `/queues/${encodeURIComponent(name)}`, { max_concurrency: value });
        dirty = false;
        render(json);
        toast(`${name}: limit ${json.max_concurrency}`);
      } catch (error) {
        toast(`${name}: ${error.message}`, 'error');
      }
    } }, limit, save);
    // The cap per concurrency key: empty means none.
    const perKey = adminOnly(h('input', { type: 'number', min: 1, max: 10000, class: 'limit per-key', placeholder: 'none',
      'aria-label': `Running tasks per concurrency key in ${name}`, name: 'key_concurrency' }));
    let perKeyDirty = false;
    perKey.addEventListener('input', () => { perKeyDirty = true; });
    const perKeyForm = h('form', { class: 'inline', onsubmit: async (event) => {
      event.preventDefault();
      const value = perKey.value === '' ? null : Number(perKey.value);
      try {
        const { json } = await call('PATCH', `/queues/${encodeURIComponent(name)}`, { key_concurrency: value });
        perKeyDirty = false;
        render(json);
        toast(`${name}: ${json.key_concurrency === null ? 'no cap per key' : `${json.key_concurrency} per key`}`);
      } catch (error) {
        toast(`${name}: ${error.message}`, 'error');
      }
    } }, perKey, adminOnly(h('button', { type: 'submit', 'aria-label': `Set the cap per key of ${name}` }, 'Set')));
    // The rate limit: tasks per second and burst; an empty rate removes it.
    const rateShown = h('span', { class: 'rate-limit' });
    const perSecond = adminOnly(h('input', { type: 'number', min: 0.001, max: 1000000, step: 'any', class: 'rate-per-second',
      'aria-label': `Tasks per second of ${name}`, name: 'per_second', placeholder: '/s' }));
    const burst = adminOnly(h('input', { type: 'number', min: 1, max: 1000000, class: 'rate-burst',
      'aria-label': `Burst of ${name}`, name: 'burst', placeholder: 'burst' }));
    let rateDirty = false;
    for (const input of [perSecond, burst]) input.addEventListener('input', () => { rateDirty = true; });
    const saveRate = adminOnly(h('button', { type: 'submit', 'aria-label': `Set the rate limit of ${name}` }, 'Set'));
    const rateForm = h('form', { class: 'inline', onsubmit: async (event) => {
      event.preventDefault();
      const rateLimit = perSecond.value === '' ? null : { per_second: Number(perSecond.value), burst: Number(burst.value || 1) };
      try {
        const { json } = await call('PATCH', `/queues/${encodeURIComponent(name)}`, { rate_limit: rateLimit });
        rateDirty = false;
        render(json);
        toast(`${name}: rate limit ${describeRate(json.rate_limit)}`);
      } catch (error) {
        toast(`${name}: ${error.message}`, 'error');
      }
    } }, rateShown, perSecond, burst, saveRate);
    const dispatch = h('td');
    const status = h('td');
    const pause = adminOnly(h('button', { type: 'button', class: 'pause' }));
    let paused = false;
    pause.addEventListener('click', async () => {
      try {
        render((await call('PATCH', `/queues/${encodeURIComponent(name)}`, { paused: !paused })).json);
      } catch (error) {
        toast(`${name}: ${error.message}`, 'error');
      }
    });
    const cancelAll = adminOnly(confirmButton('Cancel all', 'Confirm: cancel all', async () => {
      try {
        const { json } = await call('POST', `/queues/${encodeURIComponent(name)}/cancel`);
        toast(`${name}: ${json.cancelled} cancelled`);
        refresh();
      } catch (error) {
        toast(`${name}: ${error.message}`, 'error');
      }
    }, { class: 'danger', 'aria-label': `Cancel every unfinished task of ${name}` }));
    const counts = Object.fromEntries(STATES.map((state) => [state, h('a', {
      href: `#/tasks?queue=${encodeURIComponent(name)}&state=${state}`, 'aria-label': `${state} tasks of ${name}` })]));
    const finished = h('td');
    const element = h('tr', { dataset: { queue: name } },
      h('th', { scope: 'row' }, h('a', { href: `#/tasks?queue=${encodeURIComponent(name)}` }, name)),
      dispatch,
      h('td', {}, limitForm),
      h('td', {}, perKeyForm),
      h('td', {}, rateForm),
      status,
      STATES.map((state) => h('td', { class: `count state-text-${state}` }, counts[state])),
      finished,
      h('td', { class: 'actions' }, pause, cancelAll));
    return {
      element,
      update(queue) {
        paused = queue.paused;
        dispatch.textContent = queue.dispatch === 'workers'
          ? `workers${queue.waiting_workers ? ` (${queue.waiting_workers} waiting)` : ''}` : 'server';
        if (!dirty && document.activeElement !== limit) limit.value = queue.max_concurrency;
        if (!perKeyDirty && document.activeElement !== perKey) perKey.value = queue.key_concurrency ?? '';
        rateShown.textContent = describeRate(queue.rate_limit);
        if (!rateDirty && document.activeElement !== perSecond && document.activeElement !== burst) {
          perSecond.value = queue.rate_limit ? queue.rate_limit.per_second : '';
          burst.value = queue.rate_limit ? queue.rate_limit.burst : '';
        }
        fill(status, h('span', { class: `badge ${queue.paused ? 'paused' : 'active'}` }, queue.paused ? 'paused' : 'active'));
        pause.textContent = queue.paused ? 'Resume' : 'Pause';
        pause.setAttribute('aria-label', `${queue.paused ? 'Resume' : 'Pause'} ${name}`);
        for (const state of STATES) counts[state].textContent = queue.counts[state];
        fill(finished, sparkline(queue.throughput));
      },
    };
  }

  let refreshing = null;
  let again = false;
  async function refresh() {
    if (refreshing) { again = true; return; }
    refreshing = (async () => {
      try {
        const { json } = await get('/queues');
        for (const queue of json.queues) render(queue);
      } catch (error) {
        if (!(error instanceof ApiError)) throw error;
      }
    })();
    await refreshing;
    refreshing = null;
    if (again) { again = false; setTimeout(refresh, 1000); }
  }

  const { json } = await get('/queues');
  for (const queue of json.queues) render(queue);

  let scheduled = null;
  const stream = follow({ types: 'queue.updated,task.created,task.state' }, undefined, (type, data) => {
    if (type === 'queue.updated') { render(data.queue); return; }
    if (!scheduled) scheduled = setTimeout(() => { scheduled = null; refresh(); }, 1000);
  }, () => refresh());
  // The sparkline moves on with time even when nothing finishes.
  const ticker = setInterval(refresh, 10000);
  return () => {
    stream.stop();
    clearInterval(ticker);
    clearTimeout(scheduled);
  };
}
