// The page's only way to the server: the public API, as curl and the CLI use it. The bearer
// token (asked for once when the server answers 401) stays in this tab's sessionStorage.
// Events are read with fetch, not EventSource, so that the token can be sent.

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
    if (!response.ok) throw new ApiError(response.status, json);
    return { status: response.status, json, headers: response.headers };
  }
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

const connectionListeners = new Set();
const streamStates = new Map();
/** Calls `listener('live' | 'reconnecting' | 'idle')` when the page's streams change. */
export function onConnection(listener) {
  connectionListeners.add(listener);
}
function streamState(stream, state) {
  if (state === null) streamStates.delete(stream); else streamStates.set(stream, state);
  const states = [...streamStates.values()];
  const overall = states.includes('reconnecting') ? 'reconnecting' : states.length ? 'live' : 'idle';
  for (const listener of connectionListeners) listener(overall);
}

/**
 * Follows GET /events with `filters` from `since` (a sequence number, usually a list's
 * Event-Seq): `onEvent(type, data)` for each event, in order; `onReset(oldest)` when the
 * server no longer has the events asked for (re-list then). Reconnects by itself, resuming
 * after the last event seen. Returns {stop()}.
 */
export function follow(filters, since, onEvent, onReset) {
  const controller = new AbortController();
  const stream = {};
  let last = since;
  let delay = 250;
  let stopped = false;

  function dispatch(type, data, id) {
    if (id) last = id;
    if (type === 'reset') { onReset?.(JSON.parse(data).oldest); return; }
    onEvent(type, JSON.parse(data));
  }

  async function read(response) {
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

  (async () => {
    while (!stopped) {
      try {
        const sentWith = token;
        const response = await fetch(`/events${query({ ...filters, since: last })}`, {
          headers: authorized({ Accept: 'text/event-stream' }), signal: controller.signal, cache: 'no-store',
        });
        if (response.status === 401) {
          await afterRefusal(sentWith);
          continue;
        }
        if (!response.ok) throw new ApiError(response.status, null);
        streamState(stream, 'live');
        delay = 250;
        await read(response);
      } catch (error) {
        if (stopped) break;
      }
      if (stopped) break;
      streamState(stream, 'reconnecting');
      await new Promise((resolve) => setTimeout(resolve, delay));
      delay = Math.min(delay * 2, 5000);
    }
    streamState(stream, null);
  })();

  return {
    stop() {
      stopped = true;
      controller.abort();
      streamState(stream, null);
    },
  };
}
