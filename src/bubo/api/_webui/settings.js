// Settings kept per browser (localStorage): every sampler the server has, reasoning effort, a custom
// JSON object merged into each request, the theme and the system prompt for new conversations.
import { el } from "./dom.js";
// SAMPLERS: [legend, [[request field, label, kind, step], …]], made by the server from its sampler
// table (bubo/api/webui.py); an empty field means the server's default.
import { SAMPLERS } from "./samplers.js";

const KEY = "bubo.settings";

const FIELDS = SAMPLERS.flatMap(([, fields]) => fields);
export const REASONING_EFFORTS = ["", "off", "minimal", "low", "medium", "high", "xhigh", "max"];
export const THEMES = ["system", "light", "dark"];

export class SettingsError extends Error {}

export function loadSettings() {
  try {
    const value = JSON.parse(localStorage.getItem(KEY) || "{}");
    return value && typeof value === "object" ? value : {};
  } catch {
    return {};
  }
}

export function saveSettings(settings) {
  localStorage.setItem(KEY, JSON.stringify(settings));
}

// The request fields the settings add (numbers as numbers, then the custom JSON over them).
export function requestFields(settings) {
  const fields = {};
  for (const [key, , kind] of FIELDS) {
    const value = settings[key];
    if (value === undefined || value === "") continue;
    fields[key] = kind === "int" ? Number.parseInt(value, 10) : Number(value);
  }
  if (settings.reasoning_effort) fields.reasoning_effort = settings.reasoning_effort;
  return { ...fields, ...customJson(settings.custom_json) };
}

export function customJson(text) {
  if (!text || !text.trim()) return {};
  let value;
  try {
    value = JSON.parse(text);
  } catch (error) {
    throw new SettingsError(`Settings: the custom JSON is not valid JSON (${error.message}).`);
  }
  if (!value || typeof value !== "object" || Array.isArray(value)) {
    throw new SettingsError("Settings: the custom JSON must be an object, e.g. {\"n_probs\": 3}.");
  }
  return value;
}

// Builds the settings form into *form*; *changed* is called with the new settings on each edit.
export function buildSettingsForm(form, settings, changed) {
  const inputs = new Map();
  const field = (key, label, control) => {
    control.id = `setting-${key}`;
    control.value = settings[key] ?? control.value;
    control.addEventListener("input", () => {
      settings[key] = control.value;
      changed(settings);
    });
    inputs.set(key, control);
    return el("label", { className: "setting" }, el("span", { textContent: label }), control);
  };
  const select = (options) => {
    const node = el("select");
    for (const option of options) node.append(el("option", { value: option, textContent: option || "server default" }));
    return node;
  };
  const general = el("fieldset", {}, el("legend", { textContent: "General" }));
  general.append(
    field("theme", "Theme", select(THEMES)),
    field("reasoning_effort", "Reasoning effort", select(REASONING_EFFORTS)),
    field("default_system", "System prompt for new conversations", el("textarea", { rows: 2 })),
    field("custom_json", "Custom JSON merged into each request", el("textarea", { rows: 3, placeholder: '{"n_probs": 3}', spellcheck: false })),
  );
  form.append(general);
  for (const [legend, fields] of SAMPLERS) {
    const set = el("fieldset", {}, el("legend", { textContent: legend }));
    for (const [key, label, , step] of fields) {
      set.append(field(key, label, el("input", { type: "number", step: String(step), placeholder: "server default" })));
    }
    form.append(set);
  }
  return inputs;
}
