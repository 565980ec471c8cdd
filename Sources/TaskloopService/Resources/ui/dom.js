// Small helpers to build the page from data without innerHTML (so no text is ever parsed as
// markup), and the formats every view shares.

import { refusal } from './api.js';

export const STATES = ['scheduled', 'pending', 'queued', 'running', 'succeeded', 'failed', 'cancelled'];
export const TERMINAL = new Set(['succeeded', 'failed', 'cancelled']);
/** The states a retry takes a task out of. */
export const RETRYABLE = new Set(['failed', 'cancelled']);

function build(element, attrs, children) {
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (name === 'text') element.textContent = value;
    else if (name === 'class') element.setAttribute('class', value);
    else if (name.startsWith('on')) element.addEventListener(name.slice(2), value);
    else if (name === 'dataset') Object.assign(element.dataset, value);
    else if (name === 'value') element.value = value;
    else if (name === 'checked') element.checked = value;
    else element.setAttribute(name, value === true ? '' : String(value));
  }
  append(element, children);
  return element;
}

function append(element, children) {
  for (const child of children) {
    if (child === undefined || child === null || child === false) continue;
    if (Array.isArray(child)) append(element, child);
    else element.append(child instanceof Node ? child : String(child));
  }
}

/** An HTML element: h('a', {href, class}, 'text', child...). */
export function h(tag, attrs, ...children) {
  return build(document.createElement(tag), attrs, children);
}

const SVG_NS = 'http://www.w3.org/2000/svg';
/** An SVG element, as `h`. */
export function s(tag, attrs, ...children) {
  return build(document.createElementNS(SVG_NS, tag), attrs, children);
}

/** Replaces an element's children. */
export function fill(element, ...children) {
  element.replaceChildren();
  append(element, children);
  return element;
}

export function badge(state, cancelRequested) {
  // A running task whose cancellation is under way says so in the badge's own width.
  return h('span', { class: `badge state-${state}` }, cancelRequested && state === 'running' ? 'cancelling' : state);
}

/** A progress bar: role=progressbar with its value for assistive technology. */
export function progressBar(fraction, label) {
  const bar = h('div', { class: 'bar', role: 'progressbar', 'aria-valuemin': 0, 'aria-valuemax': 100, 'aria-label': label || 'Progress' },
    h('div', { class: 'fill' }));
  setProgress(bar, fraction);
  return bar;
}

export function setProgress(bar, fraction) {
  const fillElement = bar.firstChild;
  if (fraction === null || fraction === undefined) {
    bar.removeAttribute('aria-valuenow');
    bar.classList.add('indeterminate');
    fillElement.style.width = '';
    return;
  }
  const percent = Math.round(Math.max(0, Math.min(1, fraction)) * 1000) / 10;
  bar.classList.remove('indeterminate');
  if (bar.getAttribute('aria-valuenow') !== String(percent)) {
    bar.setAttribute('aria-valuenow', percent);
    bar.setAttribute('aria-valuetext', `${percent}%`);
    fillElement.style.width = `${percent}%`;
  }
}

export function formatTime(iso) {
  if (!iso) return '—';
  const date = new Date(iso);
  const now = new Date();
  const time = date.toLocaleTimeString(undefined, { hour12: false });
  return date.toDateString() === now.toDateString() ? time : `${date.toLocaleDateString()} ${time}`;
}

export function formatDuration(ms) {
  if (ms === null || ms === undefined || !isFinite(ms)) return '—';
  if (ms < 1000) return `${Math.max(0, Math.round(ms))} ms`;
  const seconds = ms / 1000;
  if (seconds < 60) return `${seconds.toFixed(seconds < 10 ? 1 : 0)} s`;
  const minutes = Math.floor(seconds / 60);
  if (minutes < 60) return `${minutes} m ${Math.floor(seconds % 60)} s`;
  const hours = Math.floor(minutes / 60);
  return `${hours} h ${minutes % 60} m`;
}

/** How long a task has run (or ran), from the server's timestamps and the tab's clock. */
export function runTime(task) {
  if (!task.started_at) return null;
  const end = task.finished_at ? Date.parse(task.finished_at) : Date.now();
  return end - Date.parse(task.started_at);
}

export function taskLabel(task) {
  return task.name || task.kind;
}

/** Pretty JSON in a <pre>, or a dash. */
export function jsonBlock(value, label) {
  if (value === null || value === undefined) return h('p', { class: 'muted' }, '—');
  // Focusable so a long block scrolls from the keyboard; a region so its label is announced.
  return h('pre', { class: 'json', tabindex: 0, role: 'region', 'aria-label': label }, JSON.stringify(value, null, 2));
}

export function toast(message, kind = 'info') {
  const region = document.getElementById('toasts');
  const item = h('div', { class: `toast ${kind}` }, message);
  region.append(item);
  setTimeout(() => item.remove(), kind === 'error' ? 8000 : 4000);
}

/** A button that asks "sure?" once (its label changes) before it acts: no modal in the way. */
export function confirmButton(label, confirmLabel, action, attrs = {}) {
  let armed = null;
  const button = h('button', { type: 'button', ...attrs, onclick: async () => {
    if (!armed) {
      button.textContent = confirmLabel;
      button.classList.add('armed');
      armed = setTimeout(() => { armed = null; button.textContent = label; button.classList.remove('armed'); }, 4000);
      return;
    }
    clearTimeout(armed);
    armed = null;
    button.textContent = label;
    button.classList.remove('armed');
    await action();
  } }, label);
  return button;
}

/** Disables `control` when this tab's token may not change anything, saying why (tooltip and
 * description). The page is drawn again when the token's role changes. */
export function adminOnly(control) {
  const reason = refusal();
  if (reason) {
    control.disabled = true;
    control.title = reason;
    control.setAttribute('aria-description', reason);
  }
  return control;
}

/** Runs `work` over `items` with at most `limit` at once; resolves to [{item, ok, error}]. */
export async function inBatches(items, limit, work) {
  const outcomes = [];
  let next = 0;
  async function lane() {
    while (next < items.length) {
      const item = items[next++];
      try { await work(item); outcomes.push({ item, ok: true }); } catch (error) { outcomes.push({ item, ok: false, error }); }
    }
  }
  await Promise.all(Array.from({ length: Math.min(limit, items.length) }, lane));
  return outcomes;
}
