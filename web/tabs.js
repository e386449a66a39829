// One tab at a time shows a session (protocol v4).
//
// Each tab names itself on the signaling socket (?tab=<id>, kept in sessionStorage, so a reload is the
// same tab).  The broker answers a second tab "in_use": it shows "This session is open in another tab"
// with a "Continue here" button, which reconnects with ?takeover=1; the tab that held it gets "moved",
// shows "This session moved to another tab" with "Take it back", and stops reconnecting.  Neither tab
// reconnects on its own: the user decides where the session is.
//
// Closing the tab on purpose (pagehide) tells the broker at once (a keepalive fetch to
// /sessions/{id}/leave): the seat is kept for the pool's short close_grace_s instead of the whole
// disconnect timeout a network drop gets.  A tab that does not hold the session sends nothing.

const TAB_KEY = "rb.tab";

/** This tab's id: 1..64 of [A-Za-z0-9_-], the same across reloads of this tab. */
export function tabId() {
  try {
    const saved = sessionStorage.getItem(TAB_KEY);
    if (saved && /^[A-Za-z0-9_-]{1,64}$/.test(saved)) return saved;
  } catch { /* storage off: a new id per page */ }
  const bytes = new Uint8Array(12);
  crypto.getRandomValues(bytes);
  const id = Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
  try { sessionStorage.setItem(TAB_KEY, id); } catch { /* this page only */ }
  return id;
}

/** The signaling path with this tab's id (and the takeover flag when the user chose this tab). */
export function tabSignalUrl(url, tab, takeover) {
  const sep = url.includes("?") ? "&" : "?";
  return `${url}${sep}tab=${encodeURIComponent(tab)}${takeover ? "&takeover=1" : ""}`;
}

const TEXT = Object.freeze({
  in_use: { title: "This session is open in another tab", button: "Continue here" },
  moved: { title: "This session moved to another tab", button: "Take it back" },
});

export class TabGate {
  /**
   * @param {HTMLElement} overlay  with #elsewhere-title, #elsewhere-text and #elsewhere-here inside
   * @param {() => void} onContinue  the user chose this tab: reconnect with takeover
   */
  constructor(overlay, onContinue) {
    this.overlay = overlay;
    this.state = null; // null | "in_use" | "moved"
    overlay.querySelector("#elsewhere-here").addEventListener("click", () => {
      this.hide();
      onContinue();
    });
  }

  show(kind, detail) {
    const t = TEXT[kind];
    if (!t) return;
    this.state = kind;
    this.overlay.querySelector("#elsewhere-title").textContent = t.title;
    this.overlay.querySelector("#elsewhere-text").textContent = detail || "";
    this.overlay.querySelector("#elsewhere-here").textContent = t.button;
    this.overlay.hidden = false;
    document.body.dataset.elsewhere = kind;
  }

  hide() {
    this.state = null;
    this.overlay.hidden = true;
    delete document.body.dataset.elsewhere;
  }
}

/**
 * On pagehide, tell the broker this tab is leaving on purpose.
 * @param {() => ({sessionId: string, token: string} | null)} current  null when there is nothing to leave
 * @param {string} tab  this tab's id
 */
export function leaveOnPagehide(current, tab) {
  window.addEventListener("pagehide", () => {
    const c = current();
    if (!c) return;
    const url = `/api/v1/sessions/${encodeURIComponent(c.sessionId)}/leave?tab=${encodeURIComponent(tab)}`;
    try {
      fetch(url, { method: "POST", keepalive: true, headers: { Authorization: `Bearer ${c.token}` } })
        .catch(() => { /* the page is going away; the disconnect timeout still applies */ });
    } catch { /* no fetch while unloading: the disconnect timeout applies */ }
  });
}
