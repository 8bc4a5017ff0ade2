// Small DOM helpers shared by the page's modules.

export function el(tag, props = {}, ...children) {
  const node = document.createElement(tag);
  Object.assign(node, props);
  for (const child of children) if (child !== null && child !== undefined) node.append(child);
  return node;
}

export function button(text, className, onClick, label) {
  const node = el("button", { type: "button", className, textContent: text });
  if (label) node.setAttribute("aria-label", label);
  node.addEventListener("click", onClick);
  return node;
}

export async function copyText(text, feedback) {
  try {
    await navigator.clipboard.writeText(text);
  } catch {
    const area = el("textarea", { value: text });
    document.body.append(area);
    area.select();
    document.execCommand("copy");
    area.remove();
  }
  if (feedback) {
    const before = feedback.textContent;
    feedback.textContent = "Copied";
    setTimeout(() => (feedback.textContent = before), 1200);
  }
}

// A touch screen: focusing a text field there opens the on-screen keyboard, so the page never does it unasked.
export const coarsePointer = () => window.matchMedia("(pointer: coarse)").matches;

export function newId(prefix) {
  const random = crypto.getRandomValues(new Uint32Array(2));
  return `${prefix}${Date.now().toString(36)}${random[0].toString(36)}${random[1].toString(36)}`;
}

export function download(name, text) {
  const url = URL.createObjectURL(new Blob([text], { type: "application/json" }));
  const link = el("a", { href: url, download: name });
  document.body.append(link);
  link.click();
  link.remove();
  setTimeout(() => URL.revokeObjectURL(url), 1000);
}
