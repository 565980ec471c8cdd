// The dashboard's shell: the hash router that mounts one view at a time, the connection
// indicator, what the token may do, and the "open by id" box. Each view module exports
// mount(container, params, query) returning a function that stops it (its streams and timers).

import { get, onConnection, onRole, learnRole, refusal, ApiError } from './api.js';
import { h, fill } from './dom.js';

const views = {
  queues: () => import('./queues.js'),
  tasks: () => import('./tasks.js'),
  task: () => import('./task.js'),
  workflow: () => import('./workflow.js'),
  schedules: () => import('./schedules.js'),
};

function parse(hash) {
  const [path, search = ''] = hash.replace(/^#/, '').split('?');
  const parts = path.split('/').filter(Boolean).map(decodeURIComponent);
  const query = Object.fromEntries(new URLSearchParams(search));
  if (parts[0] === 'queues') return { view: 'queues', query };
  if (parts[0] === 'schedules') return { view: 'schedules', id: parts[1], query };
  if (parts[0] === 'tasks' && parts[1]) return { view: 'task', id: parts[1], query };
  if (parts[0] === 'workflows' && parts[1]) return { view: 'workflow', id: parts[1], query };
  return { view: 'tasks', query };
}

const container = document.getElementById('view');
let stopCurrent = null;
let generation = 0;

async function route() {
  const target = parse(location.hash);
  const mine = ++generation;
  stopCurrent?.();
  stopCurrent = null;
  for (const link of document.querySelectorAll('nav a[data-section]')) {
    const current = link.dataset.section === target.view && !target.id;
    if (current) link.setAttribute('aria-current', 'page'); else link.removeAttribute('aria-current');
  }
  try {
    const module = await views[target.view]();
    if (mine !== generation) return;
    const view = h('div', { class: `view view-${target.view}` });
    fill(container, view);
    const stop = await module.mount(view, target);
    if (mine !== generation) { stop?.(); return; }
    stopCurrent = stop;
  } catch (error) {
    if (mine !== generation) return;
    fill(container, h('section', { class: 'notice error' },
      h('h1', {}, error instanceof ApiError && error.status === 404 ? 'Not found' : 'Something went wrong'),
      h('p', {}, error.message),
      h('p', {}, h('a', { href: '#/tasks' }, 'Back to tasks'))));
  }
}

window.addEventListener('hashchange', () => {
  route();
  container.focus({ preventScroll: true });
});

const indicator = document.getElementById('connection');
onConnection((state) => {
  indicator.dataset.state = state;
  indicator.textContent = state === 'live' ? 'Live' : state === 'reconnecting' ? 'Reconnecting…' : 'Idle';
});

document.getElementById('jump').addEventListener('submit', async (event) => {
  event.preventDefault();
  const input = event.target.elements.id;
  const id = input.value.trim();
  if (!id) return;
  // Tasks and workflows share one id space; whichever answers is the one.
  for (const [path, hash] of [['/tasks/', '#/tasks/'], ['/workflows/', '#/workflows/']]) {
    try {
      await get(path + encodeURIComponent(id));
      input.value = '';
      location.hash = hash + encodeURIComponent(id);
      return;
    } catch (error) {
      if (!(error instanceof ApiError) || error.status !== 404) throw error;
    }
  }
  input.setCustomValidity('No task or workflow has that id.');
  input.reportValidity();
  input.addEventListener('input', () => input.setCustomValidity(''), { once: true });
});

const access = document.getElementById('access');
function showAccess() {
  const reason = refusal();
  access.hidden = !reason;
  access.textContent = reason ? `View only: changing anything ${reason}` : '';
}

// Buttons are drawn for the token's role, so the role comes first, and a new one redraws.
learnRole().catch(() => null).then(() => {
  showAccess();
  onRole(() => { showAccess(); route(); });
  route();
});
