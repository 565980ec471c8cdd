// The page's only way to the server: the public API, as curl and the CLI use it. The bearer
// token (asked for once when the server answers 401) stays in this tab's sessionStorage, and
// what it may do (GET /whoami) decides which buttons work. Events are read with fetch, not
// EventSource, so that the token can be sent.

const TOKEN_KEY = 'taskloop.token';
let token = sessionStorage.getItem(TOKEN_KEY);
let tokenPrompt = null;

export class ApiError extends Error {
  constructor(status, problem) {
    super(problem?.detail || problem?.title || `HTTP ${status}`);
    this.status = status;
    this.problem = problem;
  }
}

function authorized(headers) {
  if (token) headers.Authorization = `Bearer ${token}`;
  return headers;
}

/** Shows the token dialog (once, however many calls were refused) and resolves with the token. */
function askForToken(refused) {
  if (tokenPrompt) return tokenPrompt;
  const dialog = document.getElementById('token-dialog');
  const input = document.getElementById('token-input');
  document.getElementById('token-reason').textContent = refused
    ? 'The server refused that token. Enter the bearer token it was started with (--auth-token).'
    : 'Enter the bearer token the server was started with (--auth-token). It is kept for this tab only.';
  tokenPrompt = new Promise((resolve) => {
    const form = document.getElementById('token-form');
    const submitted = (event) => {
      event.preventDefault();
      const value = input.value.trim();
      if (!value) return;
      form.removeEventListener('submit', submitted);
      dialog.removeEventListener('cancel', keepOpen);
      token = value;
      sessionStorage.setItem(TOKEN_KEY, value);
      input.value = '';
      dialog.close();
      tokenPrompt = null;
      resolve(value);
      relearnRole();
    };
    // Nothing works without it: Escape does not dismiss the dialog.
    const keepOpen = (event) => event.preventDefault();
    form.addEventListener('submit', submitted);
    dialog.addEventListener('cancel', keepOpen);
    dialog.showModal();
    input.focus();
  });
  return tokenPrompt;
}

/** After a 401 to a request sent with `sentWith`: asks for a token unless one came meanwhile. */
async function afterRefusal(sentWith) {
  if (token === sentWith) await askForToken(sentWith !== null);
}

/** One API call: resolves with {status, json, headers}; throws ApiError for 4xx/5xx. */
export async function call(method, path, body) {
  for (;;) {
    const sentWith = token;
    const headers = authorized({ Accept: 'application/json' });
    if (body !== undefined) headers['Content-Type'] = 'application/json';
    const response = await fetch(path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
    if (response.status === 401) {
      await afterRefusal(sentWith);
      continue;
    }
    const text = await response.text();
    let json = null;
    if (text) {
      try { json = JSON.parse(text); } catch { json = null; }
    }
    // The token file is re-read on SIGHUP: a token may lose (or gain) its role meanwhile.
    if (response.status === 403 && json?.code === 'forbidden_for_role') relearnRole();
    if (!response.ok) throw new ApiError(response.status, json);
    return { status: response.status, json, headers: response.headers };
  }
}

let role = null;
const roleListeners = new Set();

/** Calls `listener(role)` whenever what the token may do changes. */
export function onRole(listener) {
  roleListeners.add(listener);
}

/** Asks the server what this tab's token may do; resolves with the role. */
export async function learnRole() {
  const { json } = await call('GET', '/whoami');
  if (json.role !== role) {
    role = json.role;
    for (const listener of roleListeners) listener(role);
  }
  return role;
}

/** After the token changed: a call that fails leaves the role as it was. */
function relearnRole() {
  learnRole().catch(() => null);
}

/** Why this tab's token may not change anything (cancel, retry, pause...), or null if it may. */
export function refusal() {
  if (role === 'read') return 'needs an admin token; this token is read-only';
  if (role === 'worker') return 'needs an admin token; this is a worker token (it may only lease and report)';
  return null;
}

export const get = (path) => call('GET', path);

/** Cancels (`'cancel'`) or retries (`'retry'`) task `id`; resolves with the task as answered. */
export async function actOnTask(action, id) {
  const path = `/tasks/${encodeURIComponent(id)}`;
  return (action === 'cancel' ? await call('DELETE', path) : await call('POST', `${path}/retry`)).json;
}

/** What a cancel or retry of `task` (the answer) came to, in a word. */
export function outcome(action, task) {
  if (action === 'retry') return 'retried';
  return task.state === 'cancelled' ? 'cancelled' : 'cancelling';
}

export function query(params) {
  const search = new URLSearchParams();
  for (const [name, value] of Object.entries(params)) {
    if (value !== undefined && value !== null && value !== '') search.set(name, value);
  }
  const text = search.toString();
  return text ? `?${text}` : '';
}

// The event stream, shared. A browser opens at most six connections to one server, and a
// stream holds one for as long as it is open, so the views of every tab of one browser share ONE
// stream: the tab holding the lock leads (the next one waiting takes over when it closes), reads
// GET /events unfiltered and passes each event on over a BroadcastChannel; each view filters what
// it wants. A view that needs events from before the shared stream's position (its list's
// Event-Seq, or a task's whole history) gets them from a bounded replay (`until`), which ends.
// After announcing position P the leader sends only the events after P.
// Positions (event ids, Event-Seq) are opaque: a number on one server, a position on replicas.
// The page only tests them for equality; which of two comes first only the server knows, and
// says through `since` and `until`.

const LEADER_LOCK = 'taskloop.events.leader';
// Web Locks exist only in secure contexts (https, localhost): elsewhere each tab leads itself.
const shared = typeof BroadcastChannel === 'function' && navigator.locks ? new BroadcastChannel('taskloop.events') : null;
const subscribers = new Set();
/** The last position this tab heard from the current leader, or null when it has none yet. */
let position = null;
let connection = null;
const connectionListeners = new Set();
let leading = false;

/** Calls `listener('live' | 'reconnecting' | 'idle')` when the page's events change. */
export function onConnection(listener) {
  connectionListeners.add(listener);
}

function connectionChanged() {
  const state = subscribers.size === 0 ? 'idle' : connection;
  if (state) for (const listener of connectionListeners) listener(state);
}

/** Reads a server-sent event stream to its end: `dispatch(type, data, id)` for each event. */
async function readEvents(response, dispatch) {
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = '';
  let type = 'message';
  let data = [];
  let id = null;
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += value;
    let end;
    while ((end = buffer.indexOf('\n')) >= 0) {
      let line = buffer.slice(0, end);
      buffer = buffer.slice(end + 1);
      if (line.endsWith('\r')) line = line.slice(0, -1);
      if (line === '') {
        if (data.length) dispatch(type, data.join('\n'), id);
        type = 'message'; data = []; id = null;
        continue;
      }
      if (line.startsWith(':')) continue;
      const colon = line.indexOf(':');
      const field = colon < 0 ? line : line.slice(0, colon);
      let value = colon < 0 ? '' : line.slice(colon + 1);
      if (value.startsWith(' ')) value = value.slice(1);
      if (field === 'data') data.push(value);
      else if (field === 'event') type = value;
      else if (field === 'id') id = value;
    }
  }
}

/** GET /events with `params`; resolves with the response once it is a stream (asking for a token on 401). */
async function openEvents(params, signal) {
  for (;;) {
    const sentWith = token;
    const response = await fetch(`/events${query(params)}`, {
      headers: authorized({ Accept: 'text/event-stream' }), signal, cache: 'no-store',
    });
    if (response.status === 401) {
      await afterRefusal(sentWith);
      continue;
    }
    if (!response.ok) throw new ApiError(response.status, null);
    return response;
  }
}

function matches(filters, type, data) {
  if (filters.types && !filters.types.split(',').includes(type)) return false;
  const task = data.task;
  if (filters.task && task?.id !== filters.task) return false;
  if (filters.workflow && (task ? task.workflow : data.workflow?.id) !== filters.workflow) return false;
  if (filters.queue && (task ? task.queue : data.queue?.name) !== filters.queue) return false;
  return true;
}

// A subscriber is `waiting` for a position, `catching` up (replays; live events wait in
// `held`), or `live`. `complete`: the position up to which it has every matching event.
// `skipThrough`: the last of the matching events the shared stream has yet to send that the
// view already had (it listed after the stream's position); the stream's events up to that
// one are passed over.

function handOver(subscriber, id, type, data) {
  if (subscriber.skipThrough !== null) {
    if (id === subscriber.skipThrough) subscriber.skipThrough = null;
    return;
  }
  subscriber.complete = id;
  if (matches(subscriber.filters, type, data)) subscriber.onEvent(type, data);
}

function join(subscriber) {
  subscriber.replay?.abort();
  subscriber.replay = null;
  subscriber.held = [];
  subscriber.skipThrough = null;
  subscriber.state = 'waiting';
  if (position !== null) joinAt(subscriber, position);
  else if (!leading) shared?.postMessage({ kind: 'ask' });
}

/**
 * GET /events with the subscriber's filters after `since` up to `until` (it ends there, at
 * once if `until` does not come after `since`): `each(id, type, data)` for every event, resuming
 * after the last one if the connection breaks. Resolves false if the subscriber moved on.
 */
async function replay(subscriber, controller, since, until, each) {
  const { task, workflow, queue, types } = subscriber.filters;
  let delay = 250;
  for (;;) {
    try {
      const response = await openEvents({ task, workflow, queue, types, since, until }, controller.signal);
      await readEvents(response, (type, data, id) => {
        if (type === 'reset') { subscriber.onReset?.(JSON.parse(data).oldest); return; }
        since = id;
        each(id, type, JSON.parse(data));
      });
      return subscriber.replay === controller;
    } catch {
      if (subscriber.replay !== controller) return false;
      await new Promise((resolve) => setTimeout(resolve, delay));
      delay = Math.min(delay * 2, 5000);
    }
  }
}

async function joinAt(subscriber, at) {
  const since = subscriber.complete;
  if (since === null || since === at) {
    subscriber.complete = at;
    subscriber.state = 'live';
    return;
  }
  subscriber.state = 'catching';
  const controller = new AbortController();
  subscriber.replay = controller;
  // What the view missed up to the shared stream's position (nothing if it is ahead of it).
  let missed = false;
  const caughtUp = await replay(subscriber, controller, since, at, (id, type, data) => {
    missed = true;
    handOver(subscriber, id, type, data);
  });
  if (!caughtUp) return;
  // If it brought nothing, either nothing matching came between, or the view is ahead: then what
  // the stream has yet to send up to `since` is old news to it; the reverse replay names the last.
  let ahead = null;
  if (!missed && !await replay(subscriber, controller, at, since, (id) => { ahead = id; })) return;
  subscriber.complete = ahead === null ? at : since;
  subscriber.skipThrough = ahead;
  subscriber.replay = null;
  subscriber.state = 'live';
  const held = subscriber.held;
  subscriber.held = [];
  for (const [id, type, data] of held) handOver(subscriber, id, type, data);
}

/** What every tab does with the leader's messages (the leader's own tab included). */
function receive(message) {
  switch (message.kind) {
    case 'event': {
      position = message.id;
      let data = null;
      for (const subscriber of subscribers) {
        if (subscriber.state === 'waiting') continue;
        data ??= JSON.parse(message.data);
        if (subscriber.state === 'catching') subscriber.held.push([message.id, message.type, data]);
        else handOver(subscriber, message.id, message.type, data);
      }
      break;
    }
    case 'reset':
      for (const subscriber of subscribers) subscriber.onReset?.(message.oldest);
      break;
    case 'state':
      connection = message.state;
      connectionChanged();
      if (message.position !== null) {
        position = message.position;
        for (const subscriber of subscribers) if (subscriber.state === 'waiting') joinAt(subscriber, position);
      }
      break;
    case 'leader':
      // Another tab leads now, from its own position: everyone catches up from what they have.
      position = null;
      for (const subscriber of subscribers) join(subscriber);
      break;
    case 'ask':
      if (leading) announce();
      break;
  }
}

let leaderState = null;
let leaderPosition = null;

function broadcast(message) {
  shared?.postMessage(message);
  receive(message);
}

function announce() {
  broadcast({ kind: 'state', state: leaderState, position: leaderPosition });
}

/** Reads GET /events for every tab, resuming after the last event it passed on. */
async function lead() {
  leading = true;
  leaderPosition = position;
  broadcast({ kind: 'leader' });
  let delay = 250;
  for (;;) {
    try {
      const response = await openEvents({ since: leaderPosition });
      leaderPosition ??= response.headers.get('Event-Seq');
      leaderState = 'live';
      announce();
      delay = 250;
      await readEvents(response, (type, data, id) => {
        if (type === 'reset') { broadcast({ kind: 'reset', oldest: JSON.parse(data).oldest }); return; }
        leaderPosition = id;
        broadcast({ kind: 'event', id, type, data });
      });
    } catch {
      // Reconnects below.
    }
    leaderState = 'reconnecting';
    announce();
    await new Promise((resolve) => setTimeout(resolve, delay));
    delay = Math.min(delay * 2, 5000);
  }
}

if (shared) {
  shared.onmessage = (event) => receive(event.data);
  // Held until this tab closes; then the next tab waiting for it leads.
  navigator.locks.request(LEADER_LOCK, () => new Promise(() => lead()));
} else {
  lead();
}

/**
 * Follows the events matching `filters` ({task, workflow, queue, types}) after `since` (an
 * event id, usually a list's Event-Seq; '0': from the oldest kept; none: from now on): `onEvent(type, data)` for
 * each, in order; `onReset(oldest)` when the server no longer has the events asked for (re-list
 * then). Returns {stop()}.
 */
export function follow(filters, since, onEvent, onReset) {
  const subscriber = {
    filters, onEvent, onReset, complete: since ?? null, state: 'waiting', held: [], replay: null, skipThrough: null,
  };
  subscribers.add(subscriber);
  join(subscriber);
  connectionChanged();
  return {
    stop() {
      if (!subscribers.delete(subscriber)) return;
      subscriber.replay?.abort();
      subscriber.replay = null;
      connectionChanged();
    },
  };
}
