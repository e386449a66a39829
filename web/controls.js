// The controls of what the session runs, shown in the stream toolbar.
//
// The node names its control scheme in every "stats" message ("controls", broker/protocol.py
// ControlScheme); this module turns it into one line of text.  Desktops and game commands the node
// knows nothing about send null: nothing extra is shown.  Text lives here, not on the wire, so the
// node never puts markup or arbitrary strings into the page.

import { ControlScheme } from "./protocol.js";

/** One line per known scheme (tests/web/test_client_game_input.py reads it in the page). */
export const CONTROLS_TEXT = Object.freeze({
  [ControlScheme.BUILTIN_GAME]: "Arrows/WASD move · mouse aims · click shoots · Esc releases the mouse",
});

/** The line for a scheme, or "" (unknown scheme, null, missing). */
export function controlsText(scheme) {
  return (typeof scheme === "string" && Object.hasOwn(CONTROLS_TEXT, scheme)) ? CONTROLS_TEXT[scheme] : "";
}

/** Show (or hide, for "") the controls line in element `el`; only touches the DOM on change. */
export function showControls(el, scheme) {
  if (!el) return;
  const text = controlsText(scheme);
  if (el.textContent !== text) el.textContent = text;
  el.hidden = !text;
}
