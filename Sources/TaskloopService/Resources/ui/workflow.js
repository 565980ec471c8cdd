// A workflow: its tasks as a graph (SVG, layered left to right, coloured by state, with a
// progress bar in running nodes), its aggregate progress, cancel and retry. The graph zooms
// (buttons, +/- keys, ctrl+wheel) and pans (drag, arrow keys, wheel); zoomed out far, labels
// give way to colour alone so 2,000 tasks stay legible as a shape. Live from the event stream.

import { call, get, follow, query } from './api.js';
import { h, s, fill, adminOnly, STATES, TERMINAL, badge, progressBar, setProgress, taskLabel, toast, formatTime } from './dom.js';
import { layout, NODE_WIDTH, NODE_HEIGHT, GAP_X } from './graph.js';

const LABEL_SCALE = 0.45;

function truncate(text, length) {
  return text.length > length ? `${text.slice(0, length - 1)}…` : text;
}

export async function mount(view, target) {
  const id = target.id;
  const response = await get(`/workflows/${encodeURIComponent(id)}`);
  let workflow = response.json;
  const keyOf = new Map(Object.entries(workflow.keys || {}).map(([key, taskId]) => [taskId, key]));
  const tasks = new Map(workflow.tasks.map((task) => [task.id, task]));
  const nodes = new Map();

  const title = h('h1');
  const stateBadge = h('span');
  const bar = progressBar(null, 'Workflow progress');
  const progressText = h('p', { class: 'message' });
  const countsList = h('ul', { class: 'legend', 'aria-label': 'Tasks by state' });
  const cancel = adminOnly(h('button', { type: 'button', class: 'danger', onclick: async () => {
    try {
      await call('DELETE', `/workflows/${encodeURIComponent(id)}`);
      toast(`${workflow.name || id}: cancelling its unfinished tasks`);
    } catch (error) { toast(error.message, 'error'); }
  } }, 'Cancel workflow'));
  const retry = adminOnly(h('button', { type: 'button', onclick: async () => {
    try {
      const { json } = await call('POST', `/workflows/${encodeURIComponent(id)}/retry`);
      toast(`${workflow.name || id}: ${json.retried} retried`);
    } catch (error) { toast(error.message, 'error'); }
  } }, 'Retry failed and cancelled'));

  // The graph
  const graph = layout(workflow.tasks);
  const edges = s('g', { class: 'edges' });
  const nodeLayer = s('g', { class: 'nodes' });
  const svg = s('svg', { class: 'graph', role: 'group', 'aria-label': `Graph of ${workflow.tasks.length} tasks; each task links to its page`, preserveAspectRatio: 'xMidYMid meet' },
    s('defs', {}, s('marker', { id: 'arrow', viewBox: '0 0 10 10', refX: 10, refY: 5, markerWidth: 7, markerHeight: 7, orient: 'auto-start-reverse' },
      s('path', { d: 'M0,0 L10,5 L0,10 z', class: 'arrowhead' }))),
    edges, nodeLayer);
  for (const { points } of graph.edges) {
    // Straight through each layer crossed, a horizontal-tangent curve between layers. A long
    // edge left without a route (a huge graph) arches over the tasks between its ends.
    const [first, ...rest] = points;
    let d = `M${first[0]},${first[1]}`;
    let previous = first;
    rest.forEach((point, index) => {
      const crossing = index % 2 === 1;
      if (crossing) { d += ` L${point[0]},${point[1]}`; previous = point; return; }
      const bend = Math.max(20, (point[0] - previous[0]) / 2);
      const skipped = points.length === 2 ? Math.round((point[0] - previous[0]) / (NODE_WIDTH + GAP_X)) : 0;
      const arch = skipped > 0 ? NODE_HEIGHT * 0.75 + Math.min(skipped, 4) * 8 : 0;
      d += ` C${previous[0] + bend},${previous[1] - arch} ${point[0] - bend},${point[1] - arch} ${point[0]},${point[1]}`;
      previous = point;
    });
    edges.append(s('path', { d, 'marker-end': 'url(#arrow)' }));
  }
  workflow.tasks.forEach((task, index) => {
    const { x, y } = graph.positions[index];
    const label = task.name || keyOf.get(task.id) || task.kind;
    const tooltip = s('title');
    const stateText = s('text', { x: 10, y: 36, class: 'state' });
    const progress = s('rect', { x: 0, y: NODE_HEIGHT - 5, height: 5, width: 0, class: 'progress' });
    const link = s('a', { href: `#/tasks/${encodeURIComponent(task.id)}`, class: 'node', dataset: { id: task.id } },
      tooltip,
      s('rect', { width: NODE_WIDTH, height: NODE_HEIGHT, rx: 6, class: 'box' }),
      s('text', { x: 10, y: 18, class: 'label' }, truncate(label, 24)),
      stateText,
      progress);
    link.setAttribute('transform', `translate(${x},${y})`);
    nodeLayer.append(link);
    nodes.set(task.id, { link, tooltip, stateText, progress, label });
  });

  const viewport = h('div', { class: 'graph-viewport', role: 'region', tabindex: 0, 'aria-label': 'Workflow graph: arrow keys pan, plus and minus zoom, 0 fits' }, svg);
  const zoomIn = h('button', { type: 'button', 'aria-label': 'Zoom in', onclick: () => zoom(1 / 1.4) }, '+');
  const zoomOut = h('button', { type: 'button', 'aria-label': 'Zoom out', onclick: () => zoom(1.4) }, '−');
  const fit = h('button', { type: 'button', onclick: () => fitAll() }, 'Fit');
  const scaleText = h('span', { class: 'muted' });

  fill(view,
    h('nav', { class: 'crumbs', 'aria-label': 'Breadcrumb' }, h('a', { href: '#/tasks' }, 'Tasks'), ' / workflow ', h('span', { class: 'id' }, id)),
    h('div', { class: 'heading' }, title, stateBadge, h('div', { class: 'actions' }, cancel, retry)),
    h('section', { class: 'card', 'aria-labelledby': 'wf-progress' }, h('h2', { id: 'wf-progress', class: 'visually-hidden' }, 'Progress'), bar, progressText, countsList,
      h('p', {}, h('a', { href: `#/tasks${query({ workflow: id })}` }, 'Show these tasks in the table')),
      workflow.schedule ? h('p', {}, 'Made by the ', h('a', { class: 'schedule', href: `#/schedules/${encodeURIComponent(workflow.schedule.id)}` },
        `schedule's run of ${formatTime(workflow.schedule.slot)}`)) : null),
    h('div', { class: 'graph-tools', role: 'toolbar', 'aria-label': 'Graph zoom' }, zoomOut, zoomIn, fit, scaleText),
    viewport);

  // Zoom and pan by moving the viewBox.
  let box = { x: 0, y: 0, width: graph.width, height: graph.height };
  function scale() {
    return Math.min(viewport.clientWidth / box.width, viewport.clientHeight / box.height);
  }
  function apply() {
    svg.setAttribute('viewBox', `${box.x} ${box.y} ${box.width} ${box.height}`);
    const current = scale();
    svg.classList.toggle('far', current < LABEL_SCALE);
    scaleText.textContent = `${Math.round(current * 100)}%${current < LABEL_SCALE ? ' — zoom in for names' : ''}`;
  }
  function fitAll() {
    const margin = 20;
    box = { x: -margin, y: -margin, width: graph.width + 2 * margin, height: graph.height + 2 * margin };
    apply();
  }
  function zoom(factor, centerX = 0.5, centerY = 0.5) {
    const width = Math.min(Math.max(box.width * factor, 200), Math.max(graph.width, graph.height) * 4 + 400);
    const height = box.height * (width / box.width);
    box = { x: box.x + (box.width - width) * centerX, y: box.y + (box.height - height) * centerY, width, height };
    apply();
  }
  function pan(dx, dy) {
    box = { ...box, x: box.x + dx * box.width, y: box.y + dy * box.height };
    apply();
  }
  viewport.addEventListener('wheel', (event) => {
    event.preventDefault();
    const rect = viewport.getBoundingClientRect();
    if (event.ctrlKey || event.metaKey) zoom(event.deltaY > 0 ? 1.15 : 1 / 1.15, (event.clientX - rect.left) / rect.width, (event.clientY - rect.top) / rect.height);
    else pan(event.deltaX / rect.width, event.deltaY / rect.height);
  }, { passive: false });
  let drag = null;
  viewport.addEventListener('pointerdown', (event) => {
    if (event.button !== 0 || event.target.closest('a')) return;
    drag = { x: event.clientX, y: event.clientY };
    viewport.setPointerCapture(event.pointerId);
  });
  viewport.addEventListener('pointermove', (event) => {
    if (!drag) return;
    const rect = viewport.getBoundingClientRect();
    pan((drag.x - event.clientX) / rect.width, (drag.y - event.clientY) / rect.height);
    drag = { x: event.clientX, y: event.clientY };
  });
  viewport.addEventListener('pointerup', () => { drag = null; });
  viewport.addEventListener('keydown', (event) => {
    if (event.target !== viewport) return;
    const moves = { ArrowLeft: [-0.1, 0], ArrowRight: [0.1, 0], ArrowUp: [0, -0.1], ArrowDown: [0, 0.1] };
    if (moves[event.key]) pan(...moves[event.key]);
    else if (event.key === '+' || event.key === '=') zoom(1 / 1.4);
    else if (event.key === '-') zoom(1.4);
    else if (event.key === '0') fitAll();
    else return;
    event.preventDefault();
  });

  function renderNode(task) {
    const node = nodes.get(task.id);
    if (!node) return;
    const running = task.state === 'running';
    node.link.setAttribute('class', `node state-${task.state}${task.cancel_requested && running ? ' cancelling' : ''}`);
    const fraction = task.state === 'succeeded' ? 1 : task.progress.fraction;
    node.progress.setAttribute('width', running && fraction !== null ? Math.round(fraction * NODE_WIDTH) : 0);
    const percent = fraction === null || fraction === undefined ? '' : ` ${Math.round(fraction * 100)}%`;
    node.stateText.textContent = `${task.state}${running ? percent : ''}`;
    node.tooltip.textContent = `${node.label}: ${task.state}${running ? percent : ''}${task.progress.message ? ` — ${task.progress.message}` : ''}`;
    node.link.setAttribute('aria-label', node.tooltip.textContent);
  }

  function renderSummary() {
    title.textContent = workflow.name || 'Workflow';
    document.title = `${workflow.name || 'Workflow'} · Taskloop`;
    fill(stateBadge, badge(workflow.state));
    const all = [...tasks.values()];
    const counts = Object.fromEntries(STATES.map((state) => [state, 0]));
    let sum = 0;
    for (const task of all) {
      counts[task.state]++;
      sum += TERMINAL.has(task.state) ? 1 : task.progress.fraction || 0;
    }
    const finished = counts.succeeded + counts.failed + counts.cancelled;
    setProgress(bar, all.length ? sum / all.length : 1);
    progressText.textContent = `${finished} of ${all.length} tasks finished`;
    fill(countsList, STATES.filter((state) => counts[state]).map((state) => h('li', {}, h('span', { class: `swatch state-${state}`, 'aria-hidden': 'true' }), `${state} ${counts[state]}`)));
    cancel.hidden = all.every((task) => TERMINAL.has(task.state));
    retry.hidden = !(counts.failed || counts.cancelled);
  }

  let frame = null;
  const dirty = new Set();
  function changed(task) {
    tasks.set(task.id, task);
    dirty.add(task.id);
    if (frame === null) frame = requestAnimationFrame(() => {
      frame = null;
      for (const taskId of dirty) renderNode(tasks.get(taskId));
      dirty.clear();
      renderSummary();
    });
  }

  for (const task of workflow.tasks) renderNode(task);
  renderSummary();
  fitAll();
  // A small graph is shown at its natural size, not blown up.
  if (scale() > 1) zoom(scale());
  const resize = new ResizeObserver(() => apply());
  resize.observe(viewport);

  async function reload() {
    const { json } = await get(`/workflows/${encodeURIComponent(id)}`);
    workflow = json;
    for (const task of json.tasks) changed(task);
  }
  const stream = follow({ workflow: id, types: 'task.state,task.progress,workflow.state' }, response.headers.get('Event-Seq'), (type, data) => {
    if (type === 'workflow.state') {
      workflow = { ...workflow, ...data.workflow };
      renderSummary();
    } else if (data.task) {
      changed(data.task);
    }
  }, () => reload());

  return () => {
    stream.stop();
    resize.disconnect();
    if (frame !== null) cancelAnimationFrame(frame);
  };
}
