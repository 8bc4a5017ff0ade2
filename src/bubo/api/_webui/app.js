// Bubo's chat page. It uses only Bubo's public HTTP API: GET /v1/models, GET /props,
// POST /v1/messages/count_tokens, POST /v1/chat/completions (streamed as server-sent events) and,
// in router mode, GET /models, POST /models/load and POST /models/unload.
// Model output becomes HTML only through markdown.js (sanitized); everything else is inserted as text.
import { ApiError, api, apiKey, events, whenUnauthorized } from "./api.js";
import { AttachmentError, PASTE_LIMIT, pastedText, readFile, wireContent } from "./attachments.js";
import { coarsePointer, download, el, newId } from "./dom.js";
import { SettingsError, buildSettingsForm, loadSettings, requestFields, saveSettings } from "./settings.js";
import { StorageError, openStore } from "./store.js";
import { newestLeaf, pathTo, siblingPosition } from "./tree.js";
import { attachmentChips, renderMessage } from "./view.js";

const CURRENT_KEY = "bubo.current";
const EXPORT_FORMAT = "bubo.conversations";

// The page's own elements, looked up once before any model text is on the page: an element of
// model output can never stand in for one (and the sanitizer lets no id through anyway).
const PAGE = new Map(Array.from(document.querySelectorAll("[id]"), (node) => [node.id, node]));
const $ = (id) => PAGE.get(id);

const state = {
  store: null,
  model: null, // the model id requests name
  nCtx: null, // context size from /props (null: unknown until loaded)
  vision: false, // whether the model takes images
  router: false, // bubo serve --models-dir: a model picker
  routerModels: [],
  conversations: [], // conversation records, newest first
  current: null, // the conversation shown
  messages: [], // all messages of the current conversation (every branch)
  controller: null, // AbortController of the running generation
  streamingId: null, // the message being streamed
  nodes: new Map(), // message id → its <article> (held by reference, never looked up by selector)
  editing: null, // id of the user message being edited
  attachments: [], // the composer's
  pasted: 0,
  settings: loadSettings(),
  countTimer: null,
  countController: null,
  searchTimer: null,
  searchHits: null, // ids of the conversations matching the search
  routerTimer: null,
  toastTimer: null,
  undo: null, // what the toast's Undo does
};

// ---- conversations -----------------------------------------------------------------------------

function newConversation() {
  const now = Date.now();
  return { id: newId("c"), title: "", leaf: null, system: state.settings.default_system || "", model: null, created: now, updated: now };
}

const currentPath = () => (state.current ? pathTo(state.messages, state.current.leaf) : []);

async function persist(records) {
  try {
    await state.store.put(records);
    return true;
  } catch (error) {
    if (!(error instanceof StorageError)) throw error;
    showError(error.message);
    return false;
  }
}

async function openConversation(id) {
  const found = state.conversations.find((c) => c.id === id) || state.conversations[0];
  if (!found) {
    state.current = newConversation();
    state.conversations.unshift(state.current);
    await persist({ conversations: [state.current] });
  } else {
    state.current = found;
  }
  localStorage.setItem(CURRENT_KEY, state.current.id);
  state.messages = await state.store.messages(state.current.id);
  state.editing = null;
  if (state.router && state.current.model && state.routerModels.some((m) => m.id === state.current.model)) selectModel(state.current.model, false);
}

async function reloadConversations() {
  state.conversations = await state.store.conversations();
}

// Another tab changed some conversations: read them again (this tab's running answer is its own).
async function changedElsewhere({ conversations }) {
  await reloadConversations();
  if (!state.current) return;
  const mine = state.current.id;
  const fresh = state.conversations.find((c) => c.id === mine);
  if (conversations.includes(mine) && !state.controller) {
    if (fresh) {
      state.current = fresh;
      state.messages = await state.store.messages(mine);
    } else {
      await openConversation(null);
    }
    renderChat();
  } else if (fresh) {
    state.conversations = state.conversations.map((c) => (c.id === mine ? state.current : c));
  } else {
    state.conversations.unshift(state.current);
  }
  renderList();
}

function titleOf(conversation) {
  return conversation.title || "New chat";
}

async function switchTo(id) {
  if (state.controller) stop();
  await openConversation(id);
  showError("");
  renderAll();
  scheduleCount();
  setDrawer(false);
}

async function startNewChat() {
  if (state.controller) stop();
  state.current = newConversation();
  state.conversations.unshift(state.current);
  state.messages = [];
  localStorage.setItem(CURRENT_KEY, state.current.id);
  await persist({ conversations: [state.current] });
  showError("");
  renderAll();
  scheduleCount();
  setDrawer(false);
  focusDraft();
}

async function renameConversation(conversation) {
  const title = window.prompt("Rename conversation", titleOf(conversation));
  if (title === null) return;
  conversation.title = title.trim();
  conversation.updated = Date.now();
  await persist({ conversations: [conversation] });
  renderAll();
}

async function deleteConversation(conversation) {
  if (state.controller && conversation.id === state.current.id) stop();
  const removed = await state.store.remove(conversation.id);
  state.conversations = state.conversations.filter((c) => c.id !== conversation.id);
  if (state.current.id === conversation.id) await openConversation(state.conversations[0] && state.conversations[0].id);
  renderAll();
  scheduleCount();
  showToast(`Deleted “${titleOf(conversation)}”.`, async () => {
    if (await persist(removed)) {
      await reloadConversations();
      await openConversation(conversation.id);
      renderAll();
    }
  });
}

// ---- export and import -----------------------------------------------------------------------------

async function exportConversations(all) {
  const chosen = all ? await state.store.conversations() : [state.current];
  const list = [];
  for (const conversation of chosen) {
    const messages = (await state.store.messages(conversation.id)).sort((a, b) => a.created - b.created || (a.id < b.id ? -1 : 1));
    if (messages.length) list.push({ ...conversation, messages }); // an empty new chat is not worth a file
  }
  const name = all ? "bubo-conversations.json" : `bubo-${titleOf(state.current).replace(/[^\w-]+/g, "-").slice(0, 40) || "chat"}.json`;
  download(name, JSON.stringify({ format: EXPORT_FORMAT, version: 1, conversations: list }, null, 2));
}

function checkImport(value) {
  const bad = (why) => new Error(`Not a Bubo export: ${why}.`);
  if (!value || value.format !== EXPORT_FORMAT || !Array.isArray(value.conversations)) throw bad(`"format" must be "${EXPORT_FORMAT}" with a list of conversations`);
  value.conversations.forEach((c, i) => {
    if (!c || typeof c.id !== "string" || !Array.isArray(c.messages)) throw bad(`conversations[${i}] needs an id and messages`);
    c.messages.forEach((m, j) => {
      if (!m || typeof m.id !== "string" || !["user", "assistant"].includes(m.role) || typeof (m.content ?? "") !== "string") {
        throw bad(`conversations[${i}].messages[${j}] needs an id, a role (user or assistant) and text content`);
      }
    });
  });
  return value.conversations;
}

// A chain of parents that loops (only a crafted file has one) would never end a walk to the root:
// the link that closes the loop is cut. Each message is walked past once (`rooted`), so this is linear.
function cutLoops(messages) {
  const byId = new Map(messages.map((m) => [m.id, m]));
  const rooted = new Set();
  for (const message of messages) {
    if (rooted.has(message.id)) continue;
    const seen = new Set([message.id]);
    for (let node = message; ; ) {
      const next = byId.get(node.parent);
      if (!next || rooted.has(next.id)) break;
      if (seen.has(next.id)) {
        node.parent = null;
        break;
      }
      seen.add(next.id);
      node = next;
    }
    for (const id of seen) rooted.add(id);
  }
}

async function importConversations(file) {
  let list;
  try {
    list = checkImport(JSON.parse(await file.text()));
  } catch (error) {
    showError(`Import failed: ${error.message}`);
    return;
  }
  const records = { conversations: [], messages: [] };
  for (const { messages, ...conversation } of list) {
    // Everything imported gets a fresh id: a file's ids (another browser's, or crafted to match this
    // one's) never name a record here, so an import cannot overwrite a conversation or a message, nor
    // move one into another conversation. Links (parent, leaf) follow the new ids within the
    // conversation; one to anything else becomes null.
    const renamed = new Map();
    for (const m of messages) if (!renamed.has(m.id)) renamed.set(m.id, newId("m"));
    const id = newId("c");
    const map = (old) => (old === null || old === undefined ? null : renamed.get(old) ?? null);
    const given = new Set();
    const imported = messages.map((m) => {
      const fresh = given.has(m.id) ? newId("m") : renamed.get(m.id); // an id repeated in the file: its own
      given.add(m.id);
      return { ...m, id: fresh, parent: map(m.parent), conversation: id };
    });
    cutLoops(imported);
    records.conversations.push({ ...conversation, id, leaf: map(conversation.leaf) });
    records.messages.push(...imported);
  }
  if (!(await persist(records))) return;
  await reloadConversations();
  await openConversation(records.conversations[0] ? records.conversations[0].id : state.current.id);
  showError("");
  renderAll();
  announce(`Imported ${records.conversations.length} conversation${records.conversations.length === 1 ? "" : "s"}.`);
}

// ---- connecting ----------------------------------------------------------------------------------

async function connect() {
  $("model").textContent = "connecting…";
  try {
    const models = await (await api("/v1/models")).json();
    const first = models.data && models.data[0] ? models.data[0].id : null;
    const props = await (await api("/props")).json();
    state.router = props.role === "router";
    closeDialog($("key-dialog"));
    if (state.router) {
      await loadRouterModels();
      const wanted = state.current && state.current.model;
      selectModel(wanted && state.routerModels.some((m) => m.id === wanted) ? wanted : first, false);
    } else {
      state.model = first;
      takeProps(props);
    }
    $("router").hidden = !state.router;
    scheduleCount();
  } catch (error) {
    if (error.status === 401) return; // the key prompt is showing
    $("model").textContent = error.status === 503 ? "model loading…" : "server unreachable, retrying…";
    setTimeout(connect, 2000);
  }
}

function takeProps(props) {
  const settings = props.default_generation_settings;
  state.nCtx = settings && settings.n_ctx ? settings.n_ctx : null;
  state.vision = Boolean(props.modalities && props.modalities.vision);
  showModel();
}

function showModel() {
  $("model").textContent = state.nCtx ? `${state.model} · ${state.nCtx} tokens context` : state.model || "no model";
  renderAttachments();
}

// The context size of a router's model. autoload=false keeps this question from loading it; a 4xx
// (model_not_loaded) means the size is unknown until the model is loaded.
async function loadModelProps() {
  const query = `model=${encodeURIComponent(state.model || "")}&autoload=false`;
  try {
    takeProps(await (await api(`/props?${query}`)).json());
  } catch (error) {
    if (!(error.status >= 400 && error.status < 500) || error.status === 401) throw error;
    state.nCtx = null;
    state.vision = false;
    showModel();
  }
}

// ---- router mode: the models directory ---------------------------------------------------------------

const statusOf = (model) => {
  const status = model.status || {};
  return status.failed ? `failed (exit ${status.exit_code})` : status.value || "unknown";
};

async function loadRouterModels() {
  clearTimeout(state.routerTimer);
  state.routerModels = (await (await api("/models")).json()).data || [];
  renderPicker();
  const busy = state.routerModels.some((m) => m.status && m.status.value === "loading");
  const shown = state.routerModels.find((m) => m.id === state.model);
  if (shown && shown.status && shown.status.value === "loaded" && state.nCtx === null) await loadModelProps().catch(() => {});
  state.routerTimer = setTimeout(() => loadRouterModels().catch(() => {}), busy ? 1000 : 5000);
}

function renderPicker() {
  const picker = $("model-picker");
  picker.replaceChildren(...state.routerModels.map((m) => el("option", { value: m.id, textContent: `${m.id} (${statusOf(m)})` })));
  picker.value = state.model || "";
  const shown = state.routerModels.find((m) => m.id === state.model);
  const status = shown ? statusOf(shown) : "";
  $("model-status").textContent = status;
  $("model-load").disabled = !shown || ["loaded", "loading"].includes(shown.status && shown.status.value);
  $("model-unload").disabled = !shown || !["loaded", "loading"].includes(shown.status && shown.status.value);
}

function selectModel(id, remember) {
  state.model = id;
  state.nCtx = null;
  renderPicker();
  loadModelProps().catch(() => {});
  if (remember && state.current) {
    state.current.model = id;
    persist({ conversations: [state.current] });
  }
  scheduleCount();
}

async function modelAction(path) {
  try {
    await api(path, { body: { model: state.model } });
    showError("");
  } catch (error) {
    showError(error instanceof ApiError ? error.message : `The request failed: ${error.message}`);
  }
  await loadRouterModels().catch(() => {});
}

// ---- rendering -------------------------------------------------------------------------------------

// After opening a conversation: its end in view.
function renderAll() {
  renderList();
  renderChat(true);
}

function renderList() {
  const query = $("search").value.trim().toLowerCase();
  const list = $("conversations");
  const matches = query ? state.searchHits || new Set() : null;
  list.replaceChildren();
  for (const c of state.conversations) {
    if (matches && !matches.has(c.id)) continue;
    const item = el("li", { className: state.current && c.id === state.current.id ? "current" : "" });
    const open = el("button", { type: "button", className: "open", textContent: titleOf(c), title: titleOf(c) });
    open.addEventListener("click", () => switchTo(c.id));
    if (state.current && c.id === state.current.id) open.setAttribute("aria-current", "true");
    const rename = el("button", { type: "button", className: "rename", textContent: "✎", title: "Rename" });
    rename.setAttribute("aria-label", `Rename ${titleOf(c)}`);
    rename.addEventListener("click", () => renameConversation(c));
    const remove = el("button", { type: "button", className: "delete", textContent: "✕", title: "Delete" });
    remove.setAttribute("aria-label", `Delete ${titleOf(c)}`);
    remove.addEventListener("click", () => deleteConversation(c));
    item.append(open, rename, remove);
    list.append(item);
  }
  if (matches && !list.children.length) list.append(el("li", { className: "empty", textContent: "No conversation matches." }));
}

async function search() {
  const query = $("search").value.trim().toLowerCase();
  if (query) {
    const hits = new Set(state.conversations.filter((c) => titleOf(c).toLowerCase().includes(query)).map((c) => c.id));
    for (const m of await state.store.allMessages()) {
      const texts = [m.content || "", m.reasoning || "", ...(m.attachments || []).map((a) => a.text || a.name)];
      if (texts.some((t) => t.toLowerCase().includes(query))) hits.add(m.conversation);
    }
    if ($("search").value.trim().toLowerCase() !== query) return; // typed on meanwhile
    state.searchHits = hits;
  }
  renderList();
}

const atBottom = (node) => node.scrollHeight - node.scrollTop - node.clientHeight < 40;

function messageActions(message) {
  return {
    busy: Boolean(state.controller),
    streaming: message.id === state.streamingId,
    position: siblingPosition(state.messages, message),
    editing: state.editing === message.id,
    vision: state.vision,
    edit: () => {
      state.editing = message.id;
      renderChat();
    },
    cancelEdit: () => {
      state.editing = null;
      renderChat();
    },
    submitEdit: (text) => submitEdit(message, text),
    regenerate: () => regenerate(message),
    continue: () => generate({ continuing: message }),
    navigate: (step) => navigate(message, step),
  };
}

// Redraws the shown path; the view follows the end only if it was there (or *toBottom*): a reader who scrolled up stays put.
function renderChat(toBottom = false) {
  const conversation = state.current;
  $("title").textContent = titleOf(conversation);
  document.title = `${titleOf(conversation)} · Bubo`;
  $("system-prompt").value = conversation.system || "";
  const container = $("messages");
  const stick = atBottom(container);
  state.nodes = new Map();
  const nodes = currentPath().map((m) => {
    const node = renderMessage(m, messageActions(m));
    state.nodes.set(m.id, node);
    return node;
  });
  container.replaceChildren(...nodes);
  if (stick || toBottom) container.scrollTop = container.scrollHeight;
  const busy = Boolean(state.controller);
  container.setAttribute("aria-busy", String(busy));
  $("stop").hidden = !busy;
  $("send").disabled = busy;
}

// Redraws only the streaming message, at most once per animation frame; a reader who scrolled up stays where they are.
let frame = false;
function renderStreaming(message) {
  if (frame) return;
  frame = true;
  requestAnimationFrame(() => {
    frame = false;
    const old = state.nodes.get(message.id);
    if (!old || !old.isConnected) return;
    const container = $("messages");
    const stick = atBottom(container);
    const node = renderMessage(message, messageActions(message));
    state.nodes.set(message.id, node);
    old.replaceWith(node);
    if (stick) container.scrollTop = container.scrollHeight;
  });
}

function showError(text) {
  $("error").textContent = text;
  $("error").hidden = !text;
}

// One announcement for screen readers (the messages are not a live region redrawn every frame).
function announce(text) {
  $("announce").textContent = "";
  setTimeout(() => ($("announce").textContent = text), 50);
}

function showToast(text, undo) {
  clearTimeout(state.toastTimer);
  $("toast-text").textContent = text;
  $("toast").hidden = false;
  state.undo = undo;
  state.toastTimer = setTimeout(() => ($("toast").hidden = true), 10_000);
}

function showProgress(progress) {
  const { total, cache, processed, time_ms: elapsed } = progress;
  if (!total) return;
  const read = processed - cache;
  const rate = elapsed > 0 ? read / elapsed : 0; // tokens per millisecond
  const left = rate > 0 ? Math.ceil((total - processed) / rate / 1000) : null;
  $("progress").hidden = processed >= total;
  $("progress-bar").value = processed / total;
  $("progress-text").textContent = `Reading the prompt: ${processed} / ${total} tokens${cache ? ` (${cache} cached)` : ""}${left !== null ? ` · about ${left} s left` : ""}`;
}

// ---- generation ------------------------------------------------------------------------------------

function wireMessages(path) {
  const messages = [];
  const system = (state.current.system || "").trim();
  if (system) messages.push({ role: "system", content: system });
  for (const m of path) {
    // An empty answer (stopped before its first token) is not sent back as a turn.
    if (m.role === "assistant" && !m.content && !(m.tool_calls && m.tool_calls.length)) continue;
    const wire = { role: m.role, content: m.role === "user" ? wireContent(m.content, m.attachments, { vision: state.vision }) : m.content || "" };
    if (m.tool_calls && m.tool_calls.length) wire.tool_calls = m.tool_calls;
    messages.push(wire);
  }
  return messages;
}

function requestBody(path, continuing) {
  const body = {
    model: state.model || "bubo",
    messages: wireMessages(path),
    stream: true,
    return_progress: true,
    ...requestFields(state.settings),
  };
  if (continuing) body.continue_final_message = true;
  return body;
}

async function send() {
  if (state.controller) return;
  const text = $("draft").value;
  const conversation = state.current;
  const path = currentPath();
  const last = path.at(-1);
  if (!text.trim() && !state.attachments.length) {
    if (last && last.role === "user") await generate({ parent: last.id }); // the question whose answer failed
    return;
  }
  const user = { id: newId("m"), conversation: conversation.id, parent: last ? last.id : null, role: "user", content: text, created: Date.now() };
  if (state.attachments.length) user.attachments = state.attachments;
  await addUserMessage(user, () => {
    $("draft").value = "";
    state.attachments = [];
    renderAttachments();
  });
}

// Stores the question first: with the storage full it is not sent, and the typed text stays in the box.
async function addUserMessage(user, accepted) {
  const conversation = state.current;
  const before = { leaf: conversation.leaf, title: conversation.title, updated: conversation.updated, model: conversation.model };
  conversation.leaf = user.id;
  conversation.updated = Date.now();
  if (!conversation.title) conversation.title = (user.content.trim() || (user.attachments && user.attachments[0].name) || "").slice(0, 48);
  if (state.router) conversation.model = state.model;
  if (!(await persist({ conversations: [conversation], messages: [user] }))) {
    Object.assign(conversation, before);
    $("error").textContent += " Nothing was sent; your message is still in the box.";
    return;
  }
  state.messages.push(user);
  state.editing = null;
  accepted();
  renderList();
  await generate({ parent: user.id });
}

async function submitEdit(original, text) {
  if (state.controller || !text.trim()) return;
  const user = { id: newId("m"), conversation: state.current.id, parent: original.parent, role: "user", content: text, created: Date.now() };
  if (original.attachments) user.attachments = original.attachments;
  await addUserMessage(user, () => {});
}

async function regenerate(answer) {
  if (state.controller) return;
  await generate({ parent: answer.parent });
}

async function navigate(message, step) {
  const [position, , siblings] = siblingPosition(state.messages, message);
  const target = siblings[position - 1 + step];
  if (!target || state.controller) return;
  state.current.leaf = newestLeaf(state.messages, target.id);
  await persist({ conversations: [state.current] });
  renderChat();
  scheduleCount();
}

class StreamError extends Error {}

async function generate({ parent, continuing }) {
  if (state.controller) return;
  showError("");
  const conversation = state.current;
  let body;
  try {
    body = requestBody(continuing ? pathTo(state.messages, continuing.id) : pathTo(state.messages, parent), Boolean(continuing));
  } catch (error) {
    if (!(error instanceof SettingsError)) throw error;
    showError(error.message);
    return;
  }
  const reply = continuing || { id: newId("m"), conversation: conversation.id, parent, role: "assistant", content: "", reasoning: "", created: Date.now() };
  if (!continuing) {
    state.messages.push(reply);
    conversation.leaf = reply.id;
  }
  delete reply.note;
  const controller = new AbortController();
  state.controller = controller;
  state.streamingId = reply.id;
  renderChat(!continuing);
  const started = performance.now();
  let firstToken = null;
  let finished = false; // a finish_reason or [DONE] arrived
  let failed = false;
  let userStopped = false;
  try {
    const response = await api("/v1/chat/completions", {
      body,
      signal: controller.signal,
      headers: { "X-Conversation-Id": conversation.id }, // one replica per conversation behind a load balancer
    });
    for await (const data of events(response)) {
      if (data === "[DONE]") {
        finished = true;
        break;
      }
      let chunk;
      try {
        chunk = JSON.parse(data);
      } catch {
        throw new StreamError(`The server sent an event the page cannot read, so the request was stopped: ${data.slice(0, 80)}`);
      }
      if (chunk.error) throw new ApiError(null, chunk, null); // after the headers: no status, only the code
      if (chunk.prompt_progress) showProgress(chunk.prompt_progress);
      const choice = chunk.choices && chunk.choices[0];
      if (!choice) continue;
      const delta = choice.delta || {};
      if (firstToken === null && (delta.content || delta.reasoning_content || delta.tool_calls)) {
        firstToken = performance.now() - started;
        $("progress").hidden = true;
      }
      if (delta.content) reply.content += delta.content;
      if (delta.reasoning_content) reply.reasoning = (reply.reasoning || "") + delta.reasoning_content;
      if (delta.tool_calls) mergeToolCalls(reply, delta.tool_calls);
      if (choice.finish_reason) {
        finished = true;
        reply.finish_reason = choice.finish_reason;
        if (chunk.timings) reply.stats = { timings: chunk.timings, ttft_ms: firstToken };
      }
      renderStreaming(reply);
    }
    if (!finished) {
      failed = true;
      reply.note = "incomplete: the stream ended before the answer did";
      showError("The connection ended before the answer was complete (no finish_reason, no [DONE]).");
    } else if (reply.finish_reason === "length") {
      reply.note = "stopped at the token limit";
    }
  } catch (error) {
    if (controller.signal.aborted && !failed) {
      userStopped = true;
      reply.note = "stopped";
    } else {
      failed = true;
      controller.abort(); // a parse error or an error event ends the request: the server frees the slot
      if (reply.content) reply.note = "incomplete";
      showError(error instanceof ApiError || error instanceof StreamError ? error.message : `The request failed: ${error.message}`);
    }
  } finally {
    $("progress").hidden = true;
    if (state.controller === controller) state.controller = null;
    state.streamingId = null;
    const empty = !reply.content && !reply.reasoning && !(reply.tool_calls && reply.tool_calls.length);
    if (empty && !continuing && !userStopped) {
      state.messages = state.messages.filter((m) => m.id !== reply.id); // nothing came: the question stays for a retry
      conversation.leaf = parent;
      await persist({ conversations: [conversation] });
    } else {
      conversation.updated = Date.now();
      await persist({ conversations: [conversation], messages: [reply] });
    }
    if (state.current === conversation) renderChat();
    $("messages").dataset.answers = String(Number($("messages").dataset.answers || 0) + 1); // requests ended (for tests and tools)
    announce(reply.note === "stopped" ? "Answer stopped." : failed ? "The answer failed." : "Answer complete.");
    if (state.nCtx === null && !failed && state.router) await loadRouterModels().catch(() => {}); // loaded now
    scheduleCount();
    focusDraft();
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

// ---- attachments ---------------------------------------------------------------------------------------

async function addFiles(files) {
  for (const file of files) {
    try {
      state.attachments.push(await readFile(file));
    } catch (error) {
      showError(error instanceof AttachmentError ? error.message : `${file.name}: ${error.message}`);
    }
  }
  renderAttachments();
  scheduleCount();
}

function renderAttachments() {
  const box = $("attachments");
  box.replaceChildren();
  if (!state.attachments.length) return;
  box.append(attachmentChips(state.attachments, {
    vision: state.vision,
    remove: (index) => {
      state.attachments.splice(index, 1);
      renderAttachments();
      scheduleCount();
    },
  }));
}

// ---- live token count ------------------------------------------------------------------------------------

function scheduleCount() {
  clearTimeout(state.countTimer);
  state.countTimer = setTimeout(countTokens, 250);
}

// Anthropic blocks for count_tokens: the text parts (images are not counted: a text model is not sent them).
function countContent(content) {
  if (typeof content === "string") return content || " ";
  const blocks = content.filter((p) => p.type === "text").map((p) => ({ type: "text", text: p.text }));
  return blocks.length ? blocks : " ";
}

async function countTokens() {
  if (!state.model || state.nCtx === null || !state.current) return; // not before the model is known to be loaded
  const draft = $("draft").value;
  const path = currentPath();
  const messages = wireMessages(path).filter((m) => m.role !== "system");
  if (draft.trim() || state.attachments.length) messages.push({ role: "user", content: wireContent(draft, state.attachments, { vision: state.vision }) });
  const label = $("token-count");
  if (!messages.length) {
    label.textContent = `0 / ${state.nCtx} tokens`;
    label.classList.remove("over");
    return;
  }
  if (state.countController) state.countController.abort();
  const controller = new AbortController();
  state.countController = controller;
  const system = (state.current.system || "").trim();
  const body = { model: state.model, messages: messages.map((m) => ({ role: m.role, content: countContent(m.content) })), ...(system ? { system } : {}) };
  try {
    const counted = await (await api("/v1/messages/count_tokens", { body, signal: controller.signal })).json();
    const n = counted.input_tokens;
    label.textContent = `${n} / ${state.nCtx} tokens`;
    label.classList.toggle("over", n >= state.nCtx);
  } catch {
    if (!controller.signal.aborted) label.textContent = "";
  }
}

// ---- dialogs, drawer, theme ----------------------------------------------------------------------------------

const FOCUSABLE = "button:not([disabled]), input:not([disabled]), select, textarea, [href], [tabindex]:not([tabindex='-1'])";

// A modal dialog keeps Tab and Shift+Tab inside itself.
function trapFocus(dialog) {
  dialog.addEventListener("keydown", (event) => {
    if (event.key !== "Tab") return;
    const focusable = [...dialog.querySelectorAll(FOCUSABLE)].filter((n) => n.offsetParent !== null);
    if (!focusable.length) return;
    const first = focusable[0];
    const last = focusable.at(-1);
    if (event.shiftKey && document.activeElement === first) {
      event.preventDefault();
      last.focus();
    } else if (!event.shiftKey && document.activeElement === last) {
      event.preventDefault();
      first.focus();
    }
  });
}

function closeDialog(dialog) {
  if (dialog.open) dialog.close();
}

function askForKey(reason) {
  $("key-error").textContent = apiKey.get() ? reason : "";
  if (!$("key-dialog").open) $("key-dialog").showModal();
  $("key-input").focus();
}

const narrow = window.matchMedia("(max-width: 700px)");

// At phone width the conversation list is a drawer: out of the tab order (inert) while folded away.
function setDrawer(open) {
  $("sidebar").classList.toggle("open", open);
  $("toggle-sidebar").setAttribute("aria-expanded", String(open));
  $("sidebar").inert = narrow.matches && !open;
}

function applyTheme() {
  document.documentElement.dataset.theme = state.settings.theme || "system";
}

function focusDraft() {
  if (!coarsePointer()) $("draft").focus();
}

// ---- wiring -----------------------------------------------------------------------------------------------

function wireComposer() {
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
  $("draft").addEventListener("paste", (event) => {
    const text = event.clipboardData && event.clipboardData.getData("text/plain");
    const files = event.clipboardData ? [...event.clipboardData.files] : [];
    if (files.length) {
      event.preventDefault();
      addFiles(files);
    } else if (text && text.length > PASTE_LIMIT) {
      event.preventDefault(); // a long paste becomes an attachment, not a wall of text in the box
      state.pasted += 1;
      state.attachments.push(pastedText(text, state.pasted));
      renderAttachments();
      scheduleCount();
    }
  });
  $("attach").addEventListener("click", () => $("attach-file").click());
  $("attach-file").addEventListener("change", () => {
    addFiles([...$("attach-file").files]);
    $("attach-file").value = "";
  });
  const composer = $("composer");
  composer.addEventListener("dragover", (event) => {
    event.preventDefault();
    composer.classList.add("dropping");
  });
  composer.addEventListener("dragleave", () => composer.classList.remove("dropping"));
  composer.addEventListener("drop", (event) => {
    event.preventDefault();
    composer.classList.remove("dropping");
    addFiles([...event.dataTransfer.files]);
  });
  $("stop").addEventListener("click", stop);
}

function wireSidebar() {
  $("new-chat").addEventListener("click", startNewChat);
  $("search").addEventListener("input", () => {
    clearTimeout(state.searchTimer);
    state.searchTimer = setTimeout(search, 150);
  });
  $("export-all").addEventListener("click", () => exportConversations(true));
  $("export-one").addEventListener("click", () => exportConversations(false));
  $("import").addEventListener("click", () => $("import-file").click());
  $("import-file").addEventListener("change", () => {
    const [file] = $("import-file").files;
    $("import-file").value = "";
    if (file) importConversations(file);
  });
  $("toast-undo").addEventListener("click", () => {
    $("toast").hidden = true;
    const undo = state.undo;
    state.undo = null;
    if (undo) undo();
  });
  $("toggle-sidebar").addEventListener("click", () => setDrawer(!$("sidebar").classList.contains("open")));
  $("chat").addEventListener("click", (event) => {
    if (!event.target.closest("#toggle-sidebar")) setDrawer(false); // phone width: a tap beside the list folds it
  });
  narrow.addEventListener("change", () => setDrawer(false));
  $("system-prompt").addEventListener("change", async () => {
    state.current.system = $("system-prompt").value;
    await persist({ conversations: [state.current] });
    scheduleCount();
  });
  $("model-picker").addEventListener("change", () => selectModel($("model-picker").value, true));
  $("model-load").addEventListener("click", () => modelAction("/models/load"));
  $("model-unload").addEventListener("click", () => modelAction("/models/unload"));
}

function wireDialogs() {
  for (const dialog of [$("key-dialog"), $("settings-dialog")]) trapFocus(dialog);
  $("key-form").addEventListener("submit", (event) => {
    event.preventDefault();
    apiKey.set($("key-input").value);
    $("key-input").value = "";
    closeDialog($("key-dialog"));
    connect();
  });
  $("key-dialog").addEventListener("cancel", (event) => event.preventDefault()); // nothing works without the key
  buildSettingsForm($("settings-fields"), state.settings, (settings) => {
    saveSettings(settings);
    applyTheme();
    scheduleCount();
  });
  $("open-settings").addEventListener("click", () => {
    $("settings-dialog").showModal();
    $("open-settings").setAttribute("aria-expanded", "true");
  });
  $("settings-dialog").addEventListener("close", () => $("open-settings").setAttribute("aria-expanded", "false"));
  $("settings-close").addEventListener("click", () => closeDialog($("settings-dialog")));
  document.addEventListener("keydown", (event) => {
    if (event.key !== "Escape" || event.isComposing || event.keyCode === 229) return; // an IME's Esc cancels its composition only
    if (state.controller && !document.querySelector("dialog[open]")) {
      event.preventDefault();
      stop();
    } else {
      setDrawer(false);
    }
  });
}

async function init() {
  applyTheme();
  whenUnauthorized(askForKey);
  wireComposer();
  wireSidebar();
  wireDialogs();
  setDrawer(false);
  try {
    state.store = await openStore((change) => changedElsewhere(change));
    await reloadConversations();
    await openConversation(localStorage.getItem(CURRENT_KEY));
  } catch (error) {
    showError(error instanceof StorageError ? error.message : `The browser's storage is not available: ${error.message}`);
    return;
  }
  renderAll();
  connect();
  focusDraft();
}

init();
