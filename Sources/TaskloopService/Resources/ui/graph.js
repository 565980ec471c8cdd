// Lays out a workflow's tasks as a layered graph, left to right: a task's layer is the longest
// chain of dependencies before it (Kahn's order, so O(tasks + edges)), and within a layer tasks
// are ordered by the mean position of their neighbours, swept down and up a few times, which
// uncrosses most edges of the fan-out/fan-in shapes workflows have. Pure: no DOM.

export const NODE_WIDTH = 180;
export const NODE_HEIGHT = 44;
export const GAP_X = 70;
const GAP_Y = 14;
const SWEEPS = 6;

/**
 * `tasks`: [{id, dependencies}]. Dependencies outside the list are ignored (a workflow's task
 * may depend on an older task). Returns {positions: [{x, y}] by task index, edges: [[from, to]]
 * by index, width, height, layers}.
 */
export function layout(tasks) {
  const count = tasks.length;
  const indexOf = new Map(tasks.map((task, index) => [task.id, index]));
  const predecessors = tasks.map((task) => task.dependencies.map((id) => indexOf.get(id)).filter((index) => index !== undefined));
  const successors = Array.from({ length: count }, () => []);
  const edges = [];
  predecessors.forEach((list, to) => list.forEach((from) => { successors[from].push(to); edges.push([from, to]); }));

  const layerOf = new Array(count).fill(0);
  const waiting = predecessors.map((list) => list.length);
  const order = [];
  for (let index = 0; index < count; index++) if (waiting[index] === 0) order.push(index);
  for (let cursor = 0; cursor < order.length; cursor++) {
    const node = order[cursor];
    for (const next of successors[node]) {
      layerOf[next] = Math.max(layerOf[next], layerOf[node] + 1);
      if (--waiting[next] === 0) order.push(next);
    }
  }
  // The server refuses cycles; should one slip through, its tasks still get a place.
  if (order.length < count) for (let index = 0; index < count; index++) if (waiting[index] > 0) order.push(index);

  const layers = [];
  for (let index = 0; index < count; index++) (layers[layerOf[index]] ||= []).push(index);
  for (let layer = 0; layer < layers.length; layer++) layers[layer] ||= [];
  const slot = new Array(count);
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
  const positions = new Array(count);
  layers.forEach((layer, column) => {
    const offset = (tallest - layer.length) / 2;
    for (const node of layer) positions[node] = { x: column * (NODE_WIDTH + GAP_X), y: (slot[node] + offset) * (NODE_HEIGHT + GAP_Y) };
  });
  return {
    positions,
    edges,
    layers: layers.length,
    width: Math.max(1, layers.length * (NODE_WIDTH + GAP_X) - GAP_X),
    height: Math.max(1, tallest * (NODE_HEIGHT + GAP_Y) - GAP_Y),
  };
}
