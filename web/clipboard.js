// The remote clipboard in this browser (protocol v4: the node sends "cb" when the desktop's
// clipboard changes).
//
// The text goes to the system clipboard with navigator.clipboard.writeText when the page may write
// (focused, permission granted).  Where it may not (no focus, no permission, an insecure origin),
// the text is kept and a "Copy remote text" button appears: its click is the user gesture that
// lets the write happen (with a hidden textarea + execCommand("copy") as the last resort).  A failed
// write is never an error on the page.  No echo: the node never sends back the viewer's own paste.

export class RemoteClipboard {
  /**
   * @param {object} o
   * @param {HTMLButtonElement | null} o.button  shown while a text waits for a gesture
   * @param {(text: string) => void} o.notify  a short message to the user
   */
  constructor(o) {
    this.o = o;
    this.text = ""; // the latest remote text
    this.pending = false; // not yet in the system clipboard
    this.writes = 0; // successful writes (tests and stats)
    this.count = 0; // "cb" messages received
    if (o.button) o.button.addEventListener("click", () => this.copyNow());
    window.addEventListener("focus", () => { if (this.pending) this.write(false); });
  }

  /** A "cb" from the node. */
  received(text) {
    if (typeof text !== "string") return;
    this.text = text;
    this.count += 1;
    this.pending = true;
    this.write(false);
  }

  async write(gesture) {
    const text = this.text;
    let ok = false;
    if (navigator.clipboard && navigator.clipboard.writeText && (gesture || document.hasFocus())) {
      try { await navigator.clipboard.writeText(text); ok = true; } catch { /* no permission or focus */ }
    }
    if (!ok && gesture) ok = copyWithSelection(text);
    if (text !== this.text) return; // a newer text arrived meanwhile: its own write decides
    this.pending = !ok;
    if (ok) {
      this.writes += 1;
      this.o.notify("Copied from the remote session to your clipboard");
    }
    this.render();
  }

  copyNow() { return this.write(true); }

  render() {
    if (!this.o.button) return;
    this.o.button.hidden = !this.pending;
    this.o.button.title = this.pending ? `Copy the remote session's text (${this.text.length} characters)` : "";
  }
}

function copyWithSelection(text) {
  const area = document.createElement("textarea");
  area.value = text;
  area.setAttribute("readonly", "");
  area.style.position = "fixed";
  area.style.opacity = "0";
  document.body.append(area);
  area.select();
  let ok = false;
  try { ok = document.execCommand("copy"); } catch { ok = false; }
  area.remove();
  return ok;
}
