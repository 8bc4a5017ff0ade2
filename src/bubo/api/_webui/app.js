// Bubo's chat page. It uses only Bubo's public HTTP API: GET /v1/models, GET /props,
// POST /v1/messages/count_tokens and POST /v1/chat/completions (streamed as server-sent events).
// Model output is Markdown rendered by marked and ALWAYS sanitized by DOMPurify before it
// becomes HTML; everything else the user or the model wrote is inserted as text.
"use strict";

(() => {
  const STORE_KEY = "bubo.conversations";
  const CURRENT_KEY = "bubo.current";
  const SETTINGS_KEY = "bubo.settings";
  const API_KEY = "bubo.apiKey"; // sessionStorage: gone when the tab closes

  // The page's own elements, looked up once before any model text is on the page: an element of
  // model output can never stand in for one (DOMPurify also renames its id and name, see markdown).
  const PAGE = new Map(Array.from(document.querySelectorAll("[id]"), (node) => [node.id, node]));
  const $ = (id) => PAGE.get(id);
  const el = (tag, props = {}, ...children) => {
    const node = document.createElement(tag);
    Object.assign(node, props);
    for (const child of children) node.append(child);
    return node;
  };

  const state = {
    model: null, // the served model id
    nCtx: null, // context size from /props
    conversations: loadConversations(),
    currentId: localStorage.getItem(CURRENT_KEY),
    controller: null, // AbortController of the running request
    countTimer: null,
    countController: null,
    streamingNode: null, // the article of the answer being streamed
  };

  // ---- storage ------------------------------------------------------------------------------

  function loadConversations() {
    try {
      const value = JSON.parse(localStorage.getItem(STORE_KEY) || "[]");
      return Array.isArray(value) ? value : [];
    } catch {
      return [];
    }
  }

  function save() {
    localStorage.setItem(STORE_KEY, JSON.stringify(state.conversations));
    if (state.currentId) localStorage.setItem(CURRENT_KEY, state.currentId);
  }

  function current() {
    let conversation = state.conversations.find((c) => c.id === state.currentId);
    if (!conversation) {
      conversation = state.conversations[0] || newConversation();
      state.currentId = conversation.id;
    }
    return conversation;
  }

  function newConversation() {
    const conversation = { id: `c${Date.now().toString(36)}${Math.random().toString(36).slice(2, 6)}`, title: "", messages: [] };
    state.conversations.unshift(conversation);
    state.currentId = conversation.id;
    return conversation;
  }

  function titleOf(conversation) {
    if (conversation.title) return conversation.title;
    const first = conversation.messages.find((m) => m.role === "user");
    return first ? first.content.slice(0, 48) : "New chat";
  }

  function loadSettings() {
    try {
      return JSON.parse(localStorage.getItem(SETTINGS_KEY) || "{}") || {};
    } catch {
      return {};
    }
  }

  function readSettings() {
    return { system: $("system-prompt").value, temperature: $("temperature").value, maxTokens: $("max-tokens").value };
  }

  // ---- HTTP ---------------------------------------------------------------------------------

  class ApiError extends Error {
    constructor(status, body, retryAfter) {
      super(describeError(status, body, retryAfter));
      this.status = status;
    }
  }

  function describeError(status, body, retryAfter) {
    const error = (body && body.error) || {};
    const message = typeof error === "string" ? error : error.message || "";
    const code = error.code || error.type || "";
    const param = error.param ? ` (${error.param})` : "";
    const wait = retryAfter ? ` Try again in ${retryAfter} s.` : "";
    if (status === 401) return "The server refused the API key (401). Enter the key again.";
    if (code === "queue_full") return `The server is busy: its queue is full (503 queue_full).${wait}\n${message}`;
    if (code === "memory_pressure") return `The server is low on memory (503 memory_pressure).${wait}\n${message}`;
    if (code === "insufficient_memory") return `The server has too little memory for this request now (503 insufficient_memory).${wait}\n${message}`;
    if (code === "not_ready") return `The model is not ready yet (503 not_ready).${wait}\n${message}`;
    return `Error${status ? ` ${status}` : ""}${code ? ` ${code}` : ""}${param}: ${message || "the request failed"}`;
  }

  function headers(json = true) {
    const result = json ? { "Content-Type": "application/json" } : {};
    const key = sessionStorage.getItem(API_KEY);
    if (key) result.Authorization = `Bearer ${key}`;
    return result;
  }

  async function api(path, { body, signal, headers: extra = {} } = {}) {
    const response = await fetch(path, {
      method: body === undefined ? "GET" : "POST",
      headers: { ...headers(body !== undefined), ...extra },
      body: body === undefined ? undefined : JSON.stringify(body),
      signal,
    });
    if (!response.ok) throw await errorOf(response);
    return response;
  }

  async function errorOf(response) {
    let body = null;
    try {
      body = await response.json();
    } catch {
      body = null;
    }
    if (response.status === 401) askForKey("The server refused this key.");
    return new ApiError(response.status, body, response.headers.get("Retry-After"));
  }

  // Server-sent events from a fetch body: yields each event's data field.
  async function* events(response) {
    const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      buffer += value.replace(/\r\n?/g, "\n");
      let end;
      while ((end = buffer.indexOf("\n\n")) >= 0) {
        const frame = buffer.slice(0, end);
        buffer = buffer.slice(end + 2);
        const data = frame
          .split("\n")
          .filter((line) => line.startsWith("data:"))
          .map((line) => line.slice(5).replace(/^ /, ""))
          .join("\n");
        if (data) yield data;
      }
    }
  }

  // ---- connecting -----------------------------------------------------------------------------

  async function connect() {
    $("model").textContent = "connecting…";
    try {
      const models = await (await api("/v1/models")).json();
      state.model = models.data && models.data[0] ? models.data[0].id : null;
      await loadProps();
      $("key-overlay").hidden = true;
      scheduleCount();
    } catch (error) {
      if (error.status === 401) return; // the key prompt is showing
      $("model").textContent = error.status === 503 ? "model loading…" : "server unreachable, retrying…";
      setTimeout(connect, 2000);
    }
  }

  // The context size. ?model= names the model to a router (bubo serve --models-dir) and
  // autoload=false keeps this question from loading it; one model ignores both. A 4xx (the
  // router's model_not_loaded) means the size is unknown until a first answer loads the model:
  // the page works without it and asks again after that answer. A 503 or no answer is thrown.
  async function loadProps() {
    const query = `model=${encodeURIComponent(state.model || "")}&autoload=false`;
    try {
      const props = await (await api(`/props?${query}`)).json();
      state.nCtx = props.default_generation_settings ? props.default_generation_settings.n_ctx : null;
    } catch (error) {
      if (!(error.status >= 400 && error.status < 500) || error.status === 401) throw error;
      state.nCtx = null;
    }
    $("model").textContent = state.nCtx ? `${state.model} · ${state.nCtx} tokens context` : state.model;
  }

  function askForKey(reason) {
    $("key-error").textContent = sessionStorage.getItem(API_KEY) ? reason : "";
    $("key-overlay").hidden = false;
    $("key-input").focus();
  }

  // ---- rendering ------------------------------------------------------------------------------

  // What Markdown itself produces, and nothing more: no form controls, no dialogs, no layout
  // elements that could draw the page's own widgets (a fake user bubble, a fake composer).
  const MARKDOWN_TAGS = ["a", "b", "blockquote", "br", "code", "del", "em", "h1", "h2", "h3", "h4", "h5", "h6",
    "hr", "i", "img", "kbd", "li", "ol", "p", "pre", "s", "strong", "sub", "sup", "table", "tbody", "td",
    "tfoot", "th", "thead", "tr", "ul"];
  // No class, id, name, style or data-* from the model: it cannot borrow the page's own styles or
  // stand in for one of its elements (DOM clobbering).
  const MARKDOWN_ATTRIBUTES = ["href", "title", "alt", "src", "align", "start"];
  const purifier = window.DOMPurify();
  purifier.addHook("afterSanitizeAttributes", (node) => {
    if (node.tagName === "A") {
      node.setAttribute("target", "_blank"); // a link from the model never replaces the page
      node.setAttribute("rel", "noopener noreferrer");
    }
  });

  // Raw HTML in model text is shown as the text it is: the only tags are the ones Markdown makes.
  const escapeHtml = (text) =>
    text.replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);
  window.marked.use({ renderer: { html: ({ text }) => escapeHtml(text) } });

  function markdown(text) {
    const html = window.marked.parse(text, { gfm: true, breaks: false });
    return purifier.sanitize(html, {
      ALLOWED_TAGS: MARKDOWN_TAGS,
      ALLOWED_ATTR: MARKDOWN_ATTRIBUTES,
      ALLOW_DATA_ATTR: false,
      ALLOW_ARIA_ATTR: false,
      ADD_ATTR: ["target"],
    });
  }

  function fillAssistant(content, message) {
    content.innerHTML = markdown(message.content || "");
    for (const pre of content.querySelectorAll("pre")) {
      const button = el("button", { type: "button", className: "copy", textContent: "Copy" });
      button.addEventListener("click", () => copy(pre.querySelector("code") || pre, button));
      pre.append(button);
    }
  }

  async function copy(node, button) {
    const text = node.textContent;
    try {
      await navigator.clipboard.writeText(text);
    } catch {
      const area = el("textarea", { value: text });
      document.body.append(area);
      area.select();
      document.execCommand("copy");
      area.remove();
    }
    button.textContent = "Copied";
    setTimeout(() => (button.textContent = "Copy"), 1200);
  }

  function renderMessage(message, index, conversation) {
    const node = el("article", { className: `message ${message.role}` });
    node.append(el("div", { className: "role", textContent: message.role === "user" ? "You" : "Assistant" }));
    if (message.reasoning) {
      const details = el("details", { className: "reasoning", open: !message.content && message.streaming });
      details.append(el("summary", { textContent: "Reasoning" }), el("div", { className: "text", textContent: message.reasoning }));
      node.append(details);
    }
    const content = el("div", { className: "content" });
    if (message.role === "user") content.textContent = message.content;
    else fillAssistant(content, message);
    node.append(content);
    if (message.tool_calls && message.tool_calls.length) {
      const details = el("details", { className: "tool-calls", open: true });
      details.append(el("summary", { textContent: `Tool calls (${message.tool_calls.length})` }));
      for (const call of message.tool_calls) {
        details.append(el("pre", { textContent: `${call.function.name}(${call.function.arguments})` }));
      }
      node.append(details);
    }
    if (message.note) node.append(el("div", { className: "note", textContent: message.note }));
    const last = index === conversation.messages.length - 1;
    if (last && !state.controller) {
      const actions = el("div", { className: "actions" });
      if (message.role === "assistant") {
        const again = el("button", { type: "button", className: "regenerate", textContent: "Regenerate" });
        again.addEventListener("click", regenerate);
        actions.append(again);
      }
      const userIndex = lastUserIndex(conversation);
      if (userIndex >= 0 && (message.role === "user" || userIndex === index - 1)) {
        const edit = el("button", { type: "button", className: "edit", textContent: "Edit" });
        edit.addEventListener("click", editLast);
        actions.append(edit);
      }
      node.append(actions);
    }
    return node;
  }

  function lastUserIndex(conversation) {
    for (let i = conversation.messages.length - 1; i >= 0; i -= 1) {
      if (conversation.messages[i].role === "user") return i;
    }
    return -1;
  }

  function render() {
    const conversation = current();
    $("title").textContent = titleOf(conversation);
    document.title = `${titleOf(conversation)} · Bubo`;
    const list = $("conversations");
    list.replaceChildren();
    for (const c of state.conversations) {
      const item = el("li", { className: c.id === conversation.id ? "current" : "" });
      const open = el("button", { type: "button", className: "open", textContent: titleOf(c), title: titleOf(c) });
      open.addEventListener("click", () => switchTo(c.id));
      const rename = el("button", { type: "button", className: "rename", textContent: "✎", title: "Rename" });
      rename.setAttribute("aria-label", `Rename ${titleOf(c)}`);
      rename.addEventListener("click", () => renameConversation(c));
      const remove = el("button", { type: "button", className: "delete", textContent: "✕", title: "Delete" });
      remove.setAttribute("aria-label", `Delete ${titleOf(c)}`);
      remove.addEventListener("click", () => deleteConversation(c));
      item.append(open, rename, remove);
      list.append(item);
    }
    const messages = $("messages");
    const nodes = conversation.messages.map((m, i) => renderMessage(m, i, conversation));
    messages.replaceChildren(...nodes);
    state.streamingNode = state.controller ? nodes.at(-1) || null : null;
    messages.scrollTop = messages.scrollHeight;
    const busy = Boolean(state.controller);
    $("stop").hidden = !busy;
    $("send").disabled = busy;
  }

  // Redraws only the streaming message, at most once per animation frame.
  let pending = false;
  function renderStreaming(conversation) {
    if (pending) return;
    pending = true;
    requestAnimationFrame(() => {
      pending = false;
      const index = conversation.messages.length - 1;
      const old = state.streamingNode; // held by reference: model text cannot pose as this node
      if (!old || !old.isConnected || conversation.id !== state.currentId) return;
      const messages = $("messages");
      const atBottom = messages.scrollHeight - messages.scrollTop - messages.clientHeight < 40;
      state.streamingNode = renderMessage(conversation.messages[index], index, conversation);
      old.replaceWith(state.streamingNode);
      if (atBottom) messages.scrollTop = messages.scrollHeight;
    });
  }

  function showError(text) {
    $("error").textContent = text;
    $("error").hidden = !text;
  }

  // ---- conversations ---------------------------------------------------------------------------

  function switchTo(id) {
    if (state.controller) stop();
    state.currentId = id;
    save();
    showError("");
    render();
    scheduleCount();
    $("sidebar").classList.remove("open");
  }

  function renameConversation(conversation) {
    const title = window.prompt("Rename conversation", titleOf(conversation));
    if (title === null) return;
    conversation.title = title.trim();
    save();
    render();
  }

  function deleteConversation(conversation) {
    if (!window.confirm(`Delete "${titleOf(conversation)}"?`)) return;
    if (state.controller && conversation.id === state.currentId) stop();
    state.conversations = state.conversations.filter((c) => c.id !== conversation.id);
    if (state.currentId === conversation.id) state.currentId = null;
    current();
    save();
    render();
    scheduleCount();
  }

  // ---- generation ------------------------------------------------------------------------------

  function wireMessages(conversation, extra) {
    const messages = [];
    const system = readSettings().system.trim();
    if (system) messages.push({ role: "system", content: system });
    for (const m of conversation.messages) {
      const wire = { role: m.role, content: m.content || "" };
      if (m.tool_calls && m.tool_calls.length) wire.tool_calls = m.tool_calls;
      messages.push(wire);
    }
    if (extra) messages.push({ role: "user", content: extra });
    return messages;
  }

  function requestBody(conversation) {
    const body = { model: state.model || "bubo", messages: wireMessages(conversation), stream: true };
    const { temperature, maxTokens } = readSettings();
    if (temperature !== "") body.temperature = Number(temperature);
    if (maxTokens !== "") body.max_tokens = Number(maxTokens);
    return body;
  }

  async function send() {
    if (state.controller) return;
    const text = $("draft").value;
    const conversation = current();
    if (!text.trim()) {
      if (conversation.messages.length && conversation.messages.at(-1).role === "user") await generate(conversation);
      return;
    }
    conversation.messages.push({ role: "user", content: text });
    $("draft").value = "";
    save();
    await generate(conversation);
  }

  async function generate(conversation) {
    showError("");
    const controller = new AbortController();
    state.controller = controller;
    const body = requestBody(conversation);
    const reply = { role: "assistant", content: "", reasoning: "", streaming: true };
    conversation.messages.push(reply);
    render();
    try {
      const response = await api("/v1/chat/completions", {
        body,
        signal: controller.signal,
        headers: { "X-Conversation-Id": conversation.id }, // one replica per conversation behind a load balancer
      });
      for await (const data of events(response)) {
        if (data === "[DONE]") break;
        const chunk = JSON.parse(data);
        if (chunk.error) throw new ApiError(null, chunk, null); // after the headers: no status, only the code
        const choice = chunk.choices && chunk.choices[0];
        if (!choice) continue;
        const delta = choice.delta || {};
        if (delta.content) reply.content += delta.content;
        if (delta.reasoning_content) reply.reasoning += delta.reasoning_content;
        if (delta.tool_calls) mergeToolCalls(reply, delta.tool_calls);
        if (choice.finish_reason === "length") reply.note = "stopped at the token limit";
        renderStreaming(conversation);
      }
    } catch (error) {
      if (controller.signal.aborted) reply.note = "stopped";
      else showError(error instanceof ApiError ? error.message : `The request failed: ${error.message}`);
    } finally {
      delete reply.streaming;
      if (!reply.content && !reply.reasoning && !(reply.tool_calls && reply.tool_calls.length) && !controller.signal.aborted) {
        conversation.messages.pop(); // nothing came: keep the user's message for a retry
      }
      if (state.controller === controller) state.controller = null;
      save();
      render();
      if (state.nCtx === null && !controller.signal.aborted) await loadProps().catch(() => {}); // loaded now
      scheduleCount();
      $("draft").focus();
    }
  }

  function mergeToolCalls(reply, deltas) {
    reply.tool_calls = reply.tool_calls || [];
    for (const delta of deltas) {
      const index = delta.index || 0;
      const call = (reply.tool_calls[index] = reply.tool_calls[index] || { id: "", type: "function", function: { name: "", arguments: "" } });
      if (delta.id) call.id = delta.id;
      if (delta.function && delta.function.name) call.function.name += delta.function.name;
      if (delta.function && delta.function.arguments) call.function.arguments += delta.function.arguments;
    }
  }

  function stop() {
    if (state.controller) state.controller.abort();
  }

  async function regenerate() {
    const conversation = current();
    if (state.controller || conversation.messages.at(-1)?.role !== "assistant") return;
    conversation.messages.pop();
    save();
    await generate(conversation);
  }

  function editLast() {
    const conversation = current();
    const index = lastUserIndex(conversation);
    if (state.controller || index < 0) return;
    $("draft").value = conversation.messages[index].content;
    conversation.messages.splice(index);
    save();
    render();
    scheduleCount();
    $("draft").focus();
  }

  // ---- live token count ------------------------------------------------------------------------

  function scheduleCount() {
    clearTimeout(state.countTimer);
    state.countTimer = setTimeout(countTokens, 250);
  }

  async function countTokens() {
    if (!state.model || state.nCtx === null) return; // not before the model is known to be loaded
    const conversation = current();
    const draft = $("draft").value;
    const messages = wireMessages(conversation, draft.trim() ? draft : null).filter((m) => m.role !== "system");
    const label = $("token-count");
    if (!messages.length) {
      label.textContent = `0 / ${state.nCtx} tokens`;
      label.classList.remove("over");
      return;
    }
    if (state.countController) state.countController.abort();
    const controller = new AbortController();
    state.countController = controller;
    const system = readSettings().system.trim();
    const body = {
      model: state.model,
      messages: messages.map((m) => ({ role: m.role, content: m.content || " " })),
      ...(system ? { system } : {}),
    };
    try {
      const counted = await (await api("/v1/messages/count_tokens", { body, signal: controller.signal })).json();
      const n = counted.input_tokens;
      label.textContent = `${n} / ${state.nCtx} tokens`;
      label.classList.toggle("over", state.nCtx !== null && n >= state.nCtx);
    } catch (error) {
      if (!controller.signal.aborted) label.textContent = "";
    }
  }

  // ---- wiring ----------------------------------------------------------------------------------

  function init() {
    const settings = loadSettings();
    $("system-prompt").value = settings.system || "";
    $("temperature").value = settings.temperature ?? "";
    $("max-tokens").value = settings.maxTokens ?? "";
    for (const id of ["system-prompt", "temperature", "max-tokens"]) {
      $(id).addEventListener("input", () => {
        localStorage.setItem(SETTINGS_KEY, JSON.stringify(readSettings()));
        scheduleCount();
      });
    }
    $("composer").addEventListener("submit", (event) => {
      event.preventDefault();
      send();
    });
    $("draft").addEventListener("keydown", (event) => {
      if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
        event.preventDefault();
        send();
      }
    });
    $("draft").addEventListener("input", scheduleCount);
    document.addEventListener("keydown", (event) => {
      if (event.key === "Escape" && state.controller) {
        event.preventDefault();
        stop();
      } else if (event.key === "Escape") {
        $("sidebar").classList.remove("open");
      }
    });
    $("stop").addEventListener("click", stop);
    $("new-chat").addEventListener("click", () => {
      if (state.controller) stop();
      newConversation();
      save();
      showError("");
      render();
      scheduleCount();
      $("sidebar").classList.remove("open");
      $("draft").focus();
    });
    $("toggle-sidebar").addEventListener("click", () => $("sidebar").classList.toggle("open"));
    $("chat").addEventListener("click", (event) => {
      if (!event.target.closest("#toggle-sidebar")) $("sidebar").classList.remove("open"); // phone width: fold it
    });
    $("key-form").addEventListener("submit", (event) => {
      event.preventDefault();
      sessionStorage.setItem(API_KEY, $("key-input").value);
      $("key-input").value = "";
      $("key-overlay").hidden = true;
      connect();
    });
    current();
    save();
    render();
    connect();
    $("draft").focus();
  }

  init();
})();
