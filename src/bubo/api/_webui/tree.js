// A conversation is a tree of messages: editing a question or regenerating an answer adds a
// sibling, so nothing is ever lost. The page shows one path, from the root to the conversation's leaf.

export function childrenOf(messages, parent) {
  return messages.filter((m) => m.parent === parent).sort((a, b) => a.created - b.created || (a.id < b.id ? -1 : 1));
}

// The messages from the root to *leaf*, in order.
export function pathTo(messages, leaf) {
  const byId = new Map(messages.map((m) => [m.id, m]));
  const path = [];
  for (let node = byId.get(leaf); node; node = byId.get(node.parent)) path.unshift(node);
  return path;
}

// The newest leaf below *id* (following the newest child at each step).
export function newestLeaf(messages, id) {
  let current = id;
  for (;;) {
    const children = childrenOf(messages, current);
    if (!children.length) return current;
    current = children.at(-1).id;
  }
}

// [position (1-based), count] of *message* among its siblings.
export function siblingPosition(messages, message) {
  const siblings = childrenOf(messages, message.parent);
  return [siblings.findIndex((m) => m.id === message.id) + 1, siblings.length, siblings];
}
