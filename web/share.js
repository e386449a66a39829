// The owner's share links (protocol v6): "Share" makes a view-only link and copies it, "Sharing (N)" opens
// the list of live links (who made each, when it expires, viewers connected) with Stop per link and
// "Stop sharing" (every link). A revoked link's viewers are disconnected by the broker and told so.
// The list is re-read after each action and every few seconds while it is open.
// Control (protocol v7): each connected viewer has "Give control" (one viewer at a time: giving it to
// another takes it from the first); the one in control has "Take back". The owner keeps control all along.

import { el, render } from "./common.js";

const REFRESH_MS = 5000; // re-read the list this often while the panel is open

export class ShareControls {
  /**
   * @param {object} o
   * @param {(method: string, path: string, body?: object) => Promise<any>} o.call  the broker API as the owner
   * @param {() => string|null} o.sessionId  the session being shown (null: none)
   * @param {HTMLElement} o.shareButton  "Share"
   * @param {HTMLElement} o.listButton  "Sharing (N)"
   * @param {HTMLElement} o.panel  the list of links, with o.panel's #share-link, #share-list, #share-stop-all
   * @param {(text: string, opts?: object) => void} o.toast
   */
  constructor(o) {
    this.o = o;
    this.shares = [];
    this.controller = null; // the viewer id in control besides the owner
    this.lastLink = null;
    this.timer = 0;
    o.shareButton.addEventListener("click", () => this.create());
    o.listButton.addEventListener("click", () => this.toggle());
    o.panel.querySelector("#share-stop-all").addEventListener("click", () => this.stopAll());
    o.panel.querySelector("#share-close").addEventListener("click", () => this.toggle(false));
  }

  get count() { return this.shares.length; }

  /** A new link: copied to the clipboard where the page may, and shown in the panel. */
  async create() {
    const sid = this.o.sessionId();
    if (!sid) return;
    try {
      const share = await this.o.call("POST", `sessions/${sid}/shares`, { role: "view" });
      this.lastLink = new URL(share.watch_url, location.href).toString();
      let copied = false;
      try { await navigator.clipboard.writeText(this.lastLink); copied = true; } catch { /* no permission */ }
      this.o.toast(copied ? "Share link copied: anyone with it can watch (view only)" : "Share link created");
      this.toggle(true);
    } catch (err) {
      this.o.toast(`Could not share: ${err.message}`, { error: true });
    }
  }

  toggle(open = this.o.panel.hidden) {
    this.o.panel.hidden = !open;
    clearInterval(this.timer);
    if (open) {
      this.timer = setInterval(() => this.refresh(), REFRESH_MS);
      this.refresh();
    }
  }

  async stop(shareId) {
    const sid = this.o.sessionId();
    if (!sid) return;
    try { await this.o.call("DELETE", `sessions/${sid}/shares/${shareId}`); } catch (err) {
      this.o.toast(`Could not stop that link: ${err.message}`, { error: true });
    }
    await this.refresh();
  }

  async stopAll() {
    const sid = this.o.sessionId();
    if (!sid) return;
    try { await this.o.call("DELETE", `sessions/${sid}/shares`); } catch (err) {
      this.o.toast(`Could not stop sharing: ${err.message}`, { error: true });
    }
    this.lastLink = null;
    await this.refresh();
  }

  /** Hand control to one connected viewer (null: take it back). */
  async control(viewer) {
    const sid = this.o.sessionId();
    if (!sid) return;
    try {
      if (viewer) await this.o.call("POST", `sessions/${sid}/control`, { viewer });
      else await this.o.call("DELETE", `sessions/${sid}/control`);
      this.o.toast(viewer ? "A viewer has control now (you keep it too)" : "You took control back");
    } catch (err) {
      this.o.toast(`Could not change control: ${err.message}`, { error: true });
    }
    await this.refresh();
  }

  /** Re-read the live links and redraw (also called when the stream view opens). */
  async refresh() {
    const sid = this.o.sessionId();
    if (!sid) { this.shares = []; this.controller = null; this.draw(); return; }
    try {
      const body = await this.o.call("GET", `sessions/${sid}/shares`);
      this.shares = body.shares || [];
      this.controller = body.controller || null;
    } catch { /* keep the last list; the next refresh tries again */ }
    this.draw();
  }

  /** Forget everything (the session ended). */
  reset() {
    this.shares = [];
    this.controller = null;
    this.lastLink = null;
    this.toggle(false);
    this.draw();
  }

  draw() {
    const { listButton, panel } = this.o;
    listButton.hidden = this.shares.length === 0;
    listButton.textContent = `Sharing (${this.shares.length})`;
    listButton.dataset.count = String(this.shares.length);
    const link = panel.querySelector("#share-link");
    link.hidden = !this.lastLink;
    link.value = this.lastLink || "";
    panel.querySelector("#share-stop-all").disabled = this.shares.length === 0;
    render(panel.querySelector("#share-list"), ...(this.shares.length ? this.shares.map((s) => el("li",
      { "data-share": s.id },
      el("span", {}, `${s.shadow ? "admin " : ""}${s.by} · ${s.viewers} watching · until `
        + new Date(s.expires_at * 1000).toLocaleTimeString()),
      el("button", { class: "ghost sm", onclick: () => this.stop(s.id) }, "Stop"),
      ...(s.viewer_ids || []).map((v, i) => (v === this.controller
        ? el("button", { class: "sm", "data-viewer": v, "data-control": "take",
                         onclick: () => this.control(null) }, `Take control back from viewer ${i + 1}`)
        : el("button", { class: "ghost sm", "data-viewer": v, "data-control": "give",
                         onclick: () => this.control(v) }, `Give control to viewer ${i + 1}`)))))
      : [el("li", { class: "muted" }, "Not shared")]));
  }
}
