// Conversations in IndexedDB: one record per conversation and one per message, each written in
// its own transaction, so two tabs never overwrite each other's work (each writes only the records
// it changed). Other tabs hear of a change on a BroadcastChannel and read the records again.
const NAME = "bubo";
const VERSION = 1;
const LEGACY_KEY = "bubo.conversations"; // the page's earlier localStorage copy, moved over once

const done = (request) =>
  new Promise((resolve, reject) => {
    request.onsuccess = () => resolve(request.result);
    request.onerror = () => reject(request.error);
  });

const finished = (transaction) =>
  new Promise((resolve, reject) => {
    transaction.oncomplete = () => resolve();
    transaction.onerror = () => reject(transaction.error);
    transaction.onabort = () => reject(transaction.error || new DOMException("aborted", "AbortError"));
  });

export class StorageError extends Error {
  constructor(cause) {
    const full = cause && cause.name === "QuotaExceededError";
    super(full ? "The browser's storage for this page is full: free some space (delete or export old conversations)."
      : `The browser could not save the conversation: ${cause && cause.message}`);
    this.full = full;
  }
}

export async function openStore(onChange) {
  const request = indexedDB.open(NAME, VERSION);
  request.onupgradeneeded = () => {
    const db = request.result;
    db.createObjectStore("conversations", { keyPath: "id" });
    db.createObjectStore("messages", { keyPath: "id" }).createIndex("conversation", "conversation");
  };
  const store = new Store(await done(request), onChange);
  await store.moveLegacy();
  return store;
}

class Store {
  constructor(db, onChange) {
    this.db = db;
    this.channel = new BroadcastChannel("bubo.conversations");
    this.channel.onmessage = (event) => onChange(event.data);
  }

  async conversations() {
    const all = await done(this.db.transaction("conversations").objectStore("conversations").getAll());
    return all.sort((a, b) => b.updated - a.updated);
  }

  async messages(conversation) {
    const index = this.db.transaction("messages").objectStore("messages").index("conversation");
    return done(index.getAll(conversation));
  }

  async allMessages() {
    return done(this.db.transaction("messages").objectStore("messages").getAll());
  }

  // Writes records (conversations and messages) in one transaction; a StorageError if they could not be.
  async put({ conversations = [], messages = [] }) {
    try {
      const transaction = this.db.transaction(["conversations", "messages"], "readwrite");
      for (const c of conversations) transaction.objectStore("conversations").put(c);
      for (const m of messages) transaction.objectStore("messages").put(m);
      await finished(transaction);
    } catch (error) {
      throw new StorageError(error);
    }
    this.announce(conversations.map((c) => c.id).concat(messages.map((m) => m.conversation)));
  }

  // Removes a conversation and its messages; returns them, for an undo.
  async remove(id) {
    const conversation = await done(this.db.transaction("conversations").objectStore("conversations").get(id));
    const messages = await this.messages(id);
    const transaction = this.db.transaction(["conversations", "messages"], "readwrite");
    transaction.objectStore("conversations").delete(id);
    for (const m of messages) transaction.objectStore("messages").delete(m.id);
    await finished(transaction);
    this.announce([id]);
    return { conversations: conversation ? [conversation] : [], messages };
  }

  async removeMessages(ids, conversation) {
    const transaction = this.db.transaction("messages", "readwrite");
    for (const id of ids) transaction.objectStore("messages").delete(id);
    await finished(transaction);
    this.announce([conversation]);
  }

  announce(ids) {
    this.channel.postMessage({ conversations: [...new Set(ids)] });
  }

  // Conversations from the localStorage copy the page kept before (a flat list per conversation).
  async moveLegacy() {
    const raw = localStorage.getItem(LEGACY_KEY);
    if (!raw) return;
    let list = [];
    try {
      list = JSON.parse(raw);
    } catch {
      list = [];
    }
    const records = { conversations: [], messages: [] };
    const now = Date.now();
    for (const [n, old] of (Array.isArray(list) ? list : []).entries()) {
      let parent = null;
      (old.messages || []).forEach((m, i) => {
        const id = `${old.id}-m${i}`;
        records.messages.push({ ...m, id, conversation: old.id, parent, created: now + i });
        parent = id;
      });
      records.conversations.push({ id: old.id, title: old.title || "", leaf: parent, system: "", created: now - n, updated: now - n });
    }
    await this.put(records);
    localStorage.removeItem(LEGACY_KEY);
  }
}
