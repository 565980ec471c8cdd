// Lays out a workflow's tasks as a layered graph, left to right (Sugiyama's scheme, kept
// simple): a task's layer is the longest chain of dependencies before it (Kahn's order, so
// O(tasks + edges)); edges that skip layers get virtual nodes in the layers between; within a
// layer nodes are ordered by the mean position of their neighbours, swept down and up a few
// times, which uncrosses most edges of the fan-out/fan-in shapes workflows have. Pure: no DOM.

export const NODE_WIDTH = 180;
export const NODE_HEIGHT = 44;
export const GAP_X = 70;
const GAP_Y = 14;
const SWEEPS = 6;
const MAX_VIRTUAL = 20000;

/**
 * `tasks`: [{id, dependencies}]. Dependencies outside the list are ignored (a workflow's task
 * may depend on an older task). An edge that skips layers runs through a virtual node in each
 * layer it crosses, ordered with the tasks, so it passes between them, never behind one (up to
 * MAX_VIRTUAL of them; past that, long edges go straight and the caller arches them).
 * Returns {positions: [{x, y}] by task index, edges: [{from, to, points: [[x, y]...]}] (the
 * route's corners: out of `from`, through each layer crossed, into `to`), width, height, layers}.
 */
export function layout(tasks) {
  const count = tasks.length;
  const indexOf = new Map(tasks.map((task, index) => [task.id, index]));
  const dependencies = tasks.map((task) => task.dependencies.map((id) => indexOf.get(id)).filter((index) => index !== undefined));
  const dependents = Array.from({ length: count }, () => []);
  dependencies.forEach((list, to) => list.forEach((from) => dependents[from].push(to)));

  const layerOf = new Array(count).fill(0);
  const waiting = dependencies.map((list) => list.length);
  const order = [];
  for (let index = 0; index < count; index++) if (waiting[index] === 0) order.push(index);
  for (let cursor = 0; cursor < order.length; cursor++) {
    const node = order[cursor];
    for (const next of dependents[node]) {
      layerOf[next] = Math.max(layerOf[next], layerOf[node] + 1);
      if (--waiting[next] === 0) order.push(next);
    }
  }

  // The ordering graph: tasks, plus a chain of virtual nodes along each edge that skips layers.
  let crossings = 0;
  dependencies.forEach((list, to) => list.forEach((from) => { crossings += Math.max(0, layerOf[to] - layerOf[from] - 1); }));
  const routeThrough = crossings <= MAX_VIRTUAL;
  const predecessors = dependencies.map(() => []);
  const successors = dependencies.map(() => []);
  const routes = [];
  dependencies.forEach((list, to) => list.forEach((from) => {
    const via = [];
    let previous = from;
    if (routeThrough) {
      for (let layer = layerOf[from] + 1; layer < layerOf[to]; layer++) {
        const node = layerOf.length;
        layerOf.push(layer);
        predecessors.push([previous]);
        successors.push([]);
        successors[previous].push(node);
        via.push(node);
        previous = node;
      }
    }
    predecessors[to].push(previous);
    successors[previous].push(to);
    routes.push({ from, to, via });
  }));
  const total = layerOf.length;

  const layers = [];
  for (let index = 0; index < total; index++) (layers[layerOf[index]] ||= []).push(index);
  for (let layer = 0; layer < layers.length; layer++) layers[layer] ||= [];
  const slot = new Array(total);
  for (const layer of layers) layer.forEach((node, position) => { slot[node] = position; });

  for (let sweep = 0; sweep < SWEEPS; sweep++) {
    const downward = sweep % 2 === 0;
    const sequence = downward ? layers.slice(1) : layers.slice(0, -1).reverse();
    for (const layer of sequence) {
      const weight = new Map();
      for (const node of layer) {
        const neighbours = downward ? predecessors[node] : successors[node];
        weight.set(node, neighbours.length ? neighbours.reduce((sum, other) => sum + slot[other], 0) / neighbours.length : slot[node]);
      }
      layer.sort((a, b) => weight.get(a) - weight.get(b) || slot[a] - slot[b]);
      layer.forEach((node, position) => { slot[node] = position; });
    }
  }

  const tallest = Math.max(1, ...layers.map((layer) => layer.length));
  const place = new Array(total);
  layers.forEach((layer, column) => {
    const offset = (tallest - layer.length) / 2;
    for (const node of layer) place[node] = { x: column * (NODE_WIDTH + GAP_X), y: (slot[node] + offset) * (NODE_HEIGHT + GAP_Y) };
  });
  const middle = NODE_HEIGHT / 2;
  const edges = routes.map(({ from, to, via }) => ({
    from,
    to,
    points: [
      [place[from].x + NODE_WIDTH, place[from].y + middle],
      ...via.flatMap((node) => [[place[node].x, place[node].y + middle], [place[node].x + NODE_WIDTH, place[node].y + middle]]),
      [place[to].x, place[to].y + middle],
    ],
  }));
  return {
    positions: place.slice(0, count),
    edges,
    layers: layers.length,
    width: Math.max(1, layers.length * (NODE_WIDTH + GAP_X) - GAP_X),
    height: Math.max(1, tallest * (NODE_HEIGHT + GAP_Y) - GAP_Y),
  };
}
