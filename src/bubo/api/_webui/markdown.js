// Model text → DOM. Markdown by marked, sanitized by DOMPurify to what Markdown itself makes; code
// blocks highlighted by highlight.js (each language's grammar loaded the first time it is needed)
// and math typeset by KaTeX (loaded the first time a formula appears), both built as DOM nodes
// after the sanitizer, at placeholders the model cannot write (its private-use characters are
// removed first).
import { el } from "./dom.js";

const OPEN = "\uE000";
const CLOSE = "\uE001";
const PLACEHOLDER = /\uE000(\d+)\uE001/g;

// What Markdown itself produces, and nothing more: no form controls, no dialogs, no layout
// elements that could draw the page's own widgets (a fake user bubble, a fake composer).
const MARKDOWN_TAGS = ["a", "b", "blockquote", "br", "code", "del", "em", "h1", "h2", "h3", "h4", "h5", "h6",
  "hr", "i", "img", "li", "ol", "p", "pre", "s", "strong", "table", "tbody", "td", "th", "thead", "tr", "ul"];
// No class, id, name, style or data-* from the model: it cannot borrow the page's own styles or
// stand in for one of its elements (DOM clobbering).
const MARKDOWN_ATTRIBUTES = ["href", "title", "alt", "src", "align", "start"];
const SANITIZE = { ALLOWED_TAGS: MARKDOWN_TAGS, ALLOWED_ATTR: MARKDOWN_ATTRIBUTES, ALLOW_DATA_ATTR: false,
  ALLOW_ARIA_ATTR: false, ADD_ATTR: ["target"] };
// highlight.js's own output: spans with its token classes around escaped text.
const HIGHLIGHTED = { ALLOWED_TAGS: ["span"], ALLOWED_ATTR: ["class"], ALLOW_DATA_ATTR: false };

const purifier = window.DOMPurify();
purifier.addHook("afterSanitizeAttributes", (node) => {
  if (node.tagName === "A") {
    node.setAttribute("target", "_blank"); // a link from the model never replaces the page
    node.setAttribute("rel", "noopener noreferrer");
  }
});
const highlightPurifier = window.DOMPurify();
highlightPurifier.addHook("uponSanitizeAttribute", (_node, data) => {
  if (data.attrName === "class" && !/^((hljs-[\w-]+|[a-z]+_+)\s*)+$/.test(data.attrValue)) data.keepAttr = false;
});

export const escapeHtml = (text) =>
  text.replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);

// ---- math: $…$, $$…$$, \(…\), \[…\]; never inside code (code spans and blocks are lexed first) ----

const INLINE_MATH = [
  [/^\$\$((?:\\[\s\S]|[^\\$])+?)\$\$/, true],
  [/^\\\[([\s\S]+?)\\\]/, true],
  [/^\\\(([\s\S]+?)\\\)/, false],
  // $x$: not "$5 and $10" (no space inside the dollars, no digit right after the closing one)
  [/^\$(?![\s$])((?:\\.|[^\\$\n])+?)(?<![\s\\])\$(?!\d)/, false],
];
const BLOCK_MATH = /^ {0,3}(\$\$|\\\[)[ \t]*\n?([\s\S]+?)\n?[ \t]*(\$\$|\\\])[ \t]*(?:\n+|$)/;

function mathExtension(slots) {
  return [
    {
      name: "blockMath",
      level: "block",
      start: (src) => src.match(/^ {0,3}(\$\$|\\\[)/m)?.index,
      tokenizer(src) {
        const match = BLOCK_MATH.exec(src);
        if (!match || (match[1] === "$$") !== (match[3] === "$$")) return undefined;
        return { type: "blockMath", raw: match[0], tex: match[2].trim() };
      },
      renderer: (token) => `<p>${slot(slots, { kind: "math", tex: token.tex, display: true })}</p>`,
    },
    {
      name: "inlineMath",
      level: "inline",
      start: (src) => src.match(/\$|\\[([]/)?.index,
      tokenizer(src) {
        for (const [pattern, display] of INLINE_MATH) {
          const match = pattern.exec(src);
          if (match) return { type: "inlineMath", raw: match[0], tex: match[1].trim(), display };
        }
        return undefined;
      },
      renderer: (token) => slot(slots, { kind: "math", tex: token.tex, display: token.display }),
    },
  ];
}

function slot(slots, value) {
  slots.push(value);
  return `${OPEN}${slots.length - 1}${CLOSE}`;
}

// ---- rendering -------------------------------------------------------------------------------

function parse(text) {
  const slots = [];
  const parser = new window.marked.Marked({
    gfm: true,
    breaks: false,
    extensions: mathExtension(slots),
    renderer: {
      html: ({ text: raw }) => escapeHtml(raw), // raw HTML in model text is shown as the text it is
      code: ({ text: code, lang }) => `<pre>${slot(slots, { kind: "code", code, lang: (lang || "").split(/\s/)[0] })}</pre>`,
      checkbox: ({ checked }) => (checked ? "☑ " : "☐ "),
    },
  });
  const html = parser.parse(text.replace(/[\uE000\uE001]/g, ""));
  return { html: purifier.sanitize(html, SANITIZE), slots };
}

// Renders model text into *container*; code blocks get a Copy button. Returns a promise that
// settles once lazily loaded grammars and KaTeX have been applied (callers need not wait).
export function renderMarkdown(container, text, { copy }) {
  const { html, slots } = parse(text);
  container.innerHTML = html;
  const pending = [];
  const walker = document.createTreeWalker(container, NodeFilter.SHOW_TEXT);
  const found = [];
  for (let node = walker.nextNode(); node; node = walker.nextNode()) {
    if (node.data.includes(OPEN)) found.push(node);
  }
  for (const node of found) {
    const parts = node.data.split(PLACEHOLDER); // text, index, text, index, …
    const replacement = parts.map((part, i) => (i % 2 ? build(slots[Number(part)], pending, copy) : document.createTextNode(part)));
    const pre = node.parentNode;
    if (pre.tagName === "PRE" && parts.length === 3 && slots[Number(parts[1])].kind === "code") pre.replaceWith(replacement[1]);
    else node.replaceWith(...replacement);
  }
  return Promise.all(pending);
}

function build(value, pending, copy) {
  if (!value) return document.createTextNode("");
  if (value.kind === "math") return buildMath(value, pending);
  const code = el("code", { textContent: value.code });
  const language = languageFile(value.lang);
  const copyButton = el("button", { type: "button", className: "copy", textContent: "Copy" });
  copyButton.setAttribute("aria-label", "Copy code");
  copyButton.addEventListener("click", () => copy(value.code, copyButton));
  const head = el("div", { className: "code-head" }, el("span", { className: "lang", textContent: value.lang || "text" }), copyButton);
  if (language) pending.push(highlight(code, value.code, language));
  return el("div", { className: "code-block" }, head, el("pre", {}, code));
}

// ---- highlight.js, one grammar file per language ------------------------------------------------

const LANGUAGES = new Set(["bash", "c", "cmake", "cpp", "csharp", "css", "dart", "diff", "dockerfile", "elixir",
  "erlang", "fortran", "go", "graphql", "haskell", "ini", "java", "javascript", "json", "julia", "kotlin", "latex",
  "less", "lua", "makefile", "markdown", "nginx", "objectivec", "ocaml", "perl", "php", "plaintext", "powershell",
  "protobuf", "python", "python-repl", "r", "ruby", "rust", "scala", "scss", "shell", "sql", "swift",
  "typescript", "x86asm", "xml", "yaml"]);
const ALIASES = { py: "python", python3: "python", js: "javascript", jsx: "javascript", mjs: "javascript",
  ts: "typescript", tsx: "typescript", sh: "bash", zsh: "bash", console: "shell", yml: "yaml", html: "xml",
  svg: "xml", "c++": "cpp", cc: "cpp", h: "c", hpp: "cpp", cs: "csharp", rs: "rust", golang: "go", kt: "kotlin",
  rb: "ruby", md: "markdown", ps1: "powershell", docker: "dockerfile", objc: "objectivec", jsonc: "json",
  tex: "latex", hs: "haskell", toml: "ini", text: "plaintext", txt: "plaintext", pycon: "python-repl",
  asm: "x86asm", proto: "protobuf", ex: "elixir", ml: "ocaml", jl: "julia", pl: "perl", f90: "fortran" };

function languageFile(lang) {
  const name = (lang || "").toLowerCase();
  const file = ALIASES[name] || name;
  return LANGUAGES.has(file) ? file : null;
}

const loaded = new Map(); // language → promise of highlight.js with that grammar registered
let core = null;

function grammar(language) {
  if (!loaded.has(language)) {
    core = core || import("./vendor/highlight/core.min.js").then((module) => module.default);
    const ready = Promise.all([core, import(`./vendor/highlight/languages/${language}.min.js`)]).then(([hljs, module]) => {
      hljs.registerLanguage(language, module.default);
      return hljs;
    });
    loaded.set(language, ready);
  }
  return loaded.get(language);
}

async function highlight(node, code, language) {
  try {
    const hljs = await grammar(language);
    const html = hljs.highlight(code, { language, ignoreIllegals: true }).value;
    node.innerHTML = highlightPurifier.sanitize(html, HIGHLIGHTED);
    node.classList.add("hljs");
    node.dataset.language = language;
  } catch (error) {
    console.warn("highlighting failed", language, error); // the code stays as plain text
  }
}

// ---- KaTeX, loaded with its styles and fonts the first time a formula is shown -----------------------

let katex = null;

function loadKatex() {
  if (!katex) {
    const style = el("link", { rel: "stylesheet", href: "/webui/vendor/katex/katex.min.css" });
    const script = el("script", { src: "/webui/vendor/katex/katex.min.js" });
    katex = new Promise((resolve, reject) => {
      script.addEventListener("load", () => resolve(window.katex));
      script.addEventListener("error", () => reject(new Error("KaTeX did not load")));
    });
    document.head.append(style, script);
  }
  return katex;
}

function buildMath({ tex, display }, pending) {
  const node = el(display ? "div" : "span", { className: display ? "math math-display" : "math math-inline", textContent: tex });
  const render = (lib) =>
    lib.render(tex, node, { displayMode: display, throwOnError: false, trust: false, strict: "ignore", maxSize: 50, maxExpand: 1000 });
  if (window.katex) render(window.katex);
  else pending.push(loadKatex().then(render, (error) => console.warn(error.message)));
  return node;
}
