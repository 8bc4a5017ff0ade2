// Files for the model: text files and PDFs become text (a PDF's text is extracted here, in the
// browser, by pdf.js, loaded the first time a PDF is attached); images are kept as data URLs and
// sent only to a model that takes images.

export const PASTE_LIMIT = 4000; // a longer paste becomes an attachment instead of flooding the box
const TEXT_LIMIT = 4 * 1024 * 1024; // characters kept from one file

export class AttachmentError extends Error {}

let pdfjs = null;
function loadPdfjs() {
  if (!pdfjs) {
    pdfjs = import("./vendor/pdfjs/pdf.min.mjs").then((module) => {
      module.GlobalWorkerOptions.workerSrc = "/webui/vendor/pdfjs/pdf.worker.min.mjs";
      return module;
    });
  }
  return pdfjs;
}

async function pdfText(file) {
  const lib = await loadPdfjs();
  const task = lib.getDocument({ data: new Uint8Array(await file.arrayBuffer()), isEvalSupported: false,
    disableFontFace: true, stopAtErrors: false });
  const pdf = await task.promise;
  try {
    const pages = [];
    for (let number = 1; number <= pdf.numPages; number += 1) {
      const content = await (await pdf.getPage(number)).getTextContent();
      pages.push(content.items.map((item) => (item.str || "") + (item.hasEOL ? "\n" : "")).join("").trim());
    }
    return pages.join("\n\n");
  } finally {
    await task.destroy();
  }
}

const isPdf = (file) => file.type === "application/pdf" || /\.pdf$/i.test(file.name);

export async function readFile(file) {
  if (file.type.startsWith("image/")) {
    const dataUrl = await new Promise((resolve, reject) => {
      const reader = new FileReader();
      reader.onload = () => resolve(reader.result);
      reader.onerror = () => reject(reader.error);
      reader.readAsDataURL(file);
    });
    return { kind: "image", name: file.name, size: file.size, type: file.type, dataUrl };
  }
  let text;
  if (isPdf(file)) {
    try {
      text = await pdfText(file);
    } catch (error) {
      throw new AttachmentError(`${file.name}: not a readable PDF (${error.message})`);
    }
    if (!text.trim()) throw new AttachmentError(`${file.name}: this PDF has no text layer (a scan?)`);
  } else {
    const head = new Uint8Array(await file.slice(0, 8192).arrayBuffer());
    if (head.includes(0)) throw new AttachmentError(`${file.name}: not a text file, a PDF or an image`);
    text = await file.text();
  }
  return { kind: "text", name: file.name, size: file.size, type: file.type || "text/plain", text: text.slice(0, TEXT_LIMIT) };
}

export function pastedText(text, number) {
  return { kind: "text", name: `pasted text ${number}`, size: text.length, type: "text/plain", text, pasted: true };
}

// The text part one attachment becomes.
export function attachmentText(attachment) {
  return `--- ${attachment.name} ---\n${attachment.text}\n--- end of ${attachment.name} ---`;
}

// Message content with its attachments, as the chat completions API takes it.
export function wireContent(text, attachments, { vision }) {
  const files = (attachments || []).filter((a) => a.kind === "text" || (vision && a.kind === "image"));
  if (!files.length) return text;
  const parts = text ? [{ type: "text", text }] : [];
  for (const a of files) {
    parts.push(a.kind === "text" ? { type: "text", text: attachmentText(a) } : { type: "image_url", image_url: { url: a.dataUrl } });
  }
  return parts;
}
