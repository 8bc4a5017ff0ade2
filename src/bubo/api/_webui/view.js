// One message as an <article>: its text (model text through markdown.js, everything else as
// text), reasoning and tool calls, attachments, the server's statistics and the actions on it.
import { button, copyText, el } from "./dom.js";
import { renderMarkdown } from "./markdown.js";

const number = (value, digits = 1) => (typeof value === "number" && Number.isFinite(value) ? value.toFixed(digits) : "?");

// The line of statistics under an answer, from the server's own timings (and the page's clock for
// the first token).
export function statistics(stats) {
  const t = stats.timings || {};
  const prompt = (t.prompt_n || 0) + (t.cache_n || 0);
  const items = [
    ["stat-prompt", `${prompt} prompt tokens (${t.cache_n ?? 0} cached, ${t.prompt_n ?? 0} new, read in ${number(t.prompt_ms, 0)} ms)`],
    ["stat-generated", `${t.predicted_n ?? 0} tokens generated`],
    ["stat-speed", `${number(t.predicted_per_second)} tokens/s`],
  ];
  if (typeof stats.ttft_ms === "number") items.push(["stat-ttft", `first token after ${Math.round(stats.ttft_ms)} ms`]);
  const node = el("div", { className: "stats" });
  items.forEach(([className, text], i) => {
    if (i) node.append(" · ");
    node.append(el("span", { className, textContent: text }));
  });
  return node;
}

function attachmentChips(attachments, { vision, remove } = {}) {
  const list = el("ul", { className: "chips" });
  attachments.forEach((a, index) => {
    const label = a.kind === "image" ? a.name : `${a.name} · ${a.text.length.toLocaleString("en")} characters`;
    const chip = el("li", { className: `chip ${a.kind}`, title: a.name });
    if (a.kind === "image") chip.append(el("img", { src: a.dataUrl, alt: a.name }));
    chip.append(el("span", { className: "chip-name", textContent: label }));
    if (a.kind === "image" && !vision) chip.append(el("span", { className: "chip-note", textContent: "not sent: this model does not take images" }));
    if (remove) chip.append(button("✕", "chip-remove", () => remove(index), `Remove ${a.name}`));
    list.append(chip);
  });
  return list;
}
export { attachmentChips };

// *actions* holds the callbacks and what the page knows: { busy, streaming, position: [i, n],
// editing, vision, copy, edit, submitEdit, cancelEdit, regenerate, continue, navigate }.
export function renderMessage(message, actions) {
  const node = el("article", { className: `message ${message.role}` });
  node.append(el("div", { className: "role", textContent: message.role === "user" ? "You" : "Assistant" }));
  if (message.reasoning) {
    const details = el("details", { className: "reasoning", open: actions.streaming && !message.content });
    details.append(el("summary", { textContent: "Reasoning" }), el("div", { className: "text", textContent: message.reasoning }));
    node.append(details);
  }
  const content = el("div", { className: "content" });
  if (actions.editing) {
    const area = el("textarea", { className: "edit-box", value: message.content, rows: 3 });
    area.setAttribute("aria-label", "Edit the message");
    const save = el("button", { type: "submit", className: "edit-send", textContent: "Send" });
    const form = el("form", { className: "edit-form" }, area, el("div", { className: "edit-bar" }, button("Cancel", "edit-cancel", actions.cancelEdit), save));
    form.addEventListener("submit", (event) => {
      event.preventDefault();
      actions.submitEdit(area.value);
    });
    content.append(form);
    requestAnimationFrame(() => area.focus());
  } else if (message.role === "user") {
    content.textContent = message.content;
  } else {
    renderMarkdown(content, message.content || "", { copy: copyText });
  }
  node.append(content);
  if (message.attachments && message.attachments.length) node.append(attachmentChips(message.attachments, { vision: actions.vision }));
  if (message.tool_calls && message.tool_calls.length) {
    const details = el("details", { className: "tool-calls", open: true });
    details.append(el("summary", { textContent: `Tool calls (${message.tool_calls.length})` }));
    for (const call of message.tool_calls) details.append(el("pre", { textContent: `${call.function.name}(${call.function.arguments})` }));
    node.append(details);
  }
  if (message.note) node.append(el("div", { className: "note", textContent: message.note }));
  if (message.stats && !actions.streaming) node.append(statistics(message.stats));
  if (!actions.busy && !actions.editing) node.append(actionBar(message, actions));
  return node;
}

function actionBar(message, actions) {
  const bar = el("div", { className: "actions" });
  const [position, count] = actions.position;
  if (count > 1) {
    const nav = el("span", { className: "siblings" });
    nav.setAttribute("role", "group");
    nav.setAttribute("aria-label", "Versions of this message");
    const previous = button("‹", "sibling-previous", () => actions.navigate(-1), "Previous version");
    const next = button("›", "sibling-next", () => actions.navigate(1), "Next version");
    previous.disabled = position <= 1;
    next.disabled = position >= count;
    nav.append(previous, el("span", { className: "sibling-position", textContent: `${position}/${count}` }), next);
    bar.append(nav);
  }
  const copy = button("Copy", "copy-message", () => copyText(message.content || "", copy), "Copy the message");
  bar.append(copy);
  if (message.role === "user") bar.append(button("Edit", "edit", actions.edit));
  if (message.role === "assistant") bar.append(button("Regenerate", "regenerate", actions.regenerate));
  if (message.role === "assistant" && message.finish_reason === "length") bar.append(button("Continue", "continue", actions.continue));
  return bar;
}
