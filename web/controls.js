// The controls of what the session runs, shown in the stream toolbar.
//
// The node names its control scheme in every "stats" message ("controls", broker/protocol.py
// ControlScheme); this module turns it into one line of text.  Desktops and game commands the node
// knows nothing about send null: nothing extra is shown.  Text lives here, not on the wire, so the
// node never puts markup or arbitrary strings into the page.

import { ControlScheme } from "./protocol.js";

/** Per known scheme, one line for a mouse and keyboard and one for a touch screen (web/touch.js gestures). */
export const CONTROLS_TEXT = Object.freeze({
  [ControlScheme.BUILTIN_GAME]: Object.freeze({
    mouse: "Arrows/WASD move · mouse aims · click shoots · Esc releases the mouse",
    touch: "Tap to aim and shoot · drag to sweep the aim",
  }),
});

/** The line for a scheme ("touch": the touch-screen line), or "" (unknown scheme, null, missing). */
export function controlsText(scheme, touch = false) {
  if (typeof scheme !== "string" || !Object.hasOwn(CONTROLS_TEXT, scheme)) return "";
  return CONTROLS_TEXT[scheme][touch ? "touch" : "mouse"];
}

/** Show (or hide, for "") the controls line in element `el`; only touches the DOM on change. */
export function showControls(el, scheme, touch = false) {
  if (!el) return;
  const text = controlsText(scheme, touch);
  if (el.textContent !== text) el.textContent = text;
  el.hidden = !text;
}
