// Keyboard routing, pure (run in Node by tests/web/test_keys.py): which key presses go to the remote
// side as physical keys ("k", KeyboardEvent.code) and which as text ("tx", the characters).
//
// The remote desktop has a US layout.  A printable key goes as its code when the US layout types the
// same character for that code (so games and shortcuts see real key presses), and as text when it would
// not (AZERTY's "é" on Digit2, QWERTZ's "z" on KeyY, "€" with AltGr).  Shortcuts (Control, Alt or Meta
// held, AltGr excepted) always go as codes; on a Latin letter, as that letter's US key (Ctrl+Z is undo
// on any layout).  The rule is documented in docs/protocol.md ("Keyboard: keys and text").

import { TEXT_MAX_CHARS } from "./protocol.js";

// US layout: character -> KeyboardEvent.code (shifted: typed with Shift held)
const US_SHIFTED = { "!": "Digit1", "@": "Digit2", "#": "Digit3", "$": "Digit4", "%": "Digit5", "^": "Digit6",
  "&": "Digit7", "*": "Digit8", "(": "Digit9", ")": "Digit0", "_": "Minus", "+": "Equal", "{": "BracketLeft",
  "}": "BracketRight", "|": "Backslash", ":": "Semicolon", "\"": "Quote", "<": "Comma", ">": "Period",
  "?": "Slash", "~": "Backquote" };
const US_PLAIN = { " ": "Space", "-": "Minus", "=": "Equal", "[": "BracketLeft", "]": "BracketRight",
  "\\": "Backslash", ";": "Semicolon", "'": "Quote", ",": "Comma", ".": "Period", "/": "Slash", "`": "Backquote",
  "\n": "Enter", "\t": "Tab" };

/** The key presses that type `ch` on a US layout: {code, shift}, or null for a character it has no key for. */
export function keyForChar(ch) {
  if (/^[a-z]$/.test(ch)) return { code: `Key${ch.toUpperCase()}`, shift: false };
  if (/^[A-Z]$/.test(ch)) return { code: `Key${ch}`, shift: true };
  if (/^[0-9]$/.test(ch)) return { code: `Digit${ch}`, shift: false };
  if (Object.hasOwn(US_PLAIN, ch)) return { code: US_PLAIN[ch], shift: false };
  if (Object.hasOwn(US_SHIFTED, ch)) return { code: US_SHIFTED[ch], shift: true };
  return null;
}

/** A KeyboardEvent.key that names a key ("Enter", "F5", "Dead", "Unidentified") rather than a character. */
const isNamedKey = (key) => /^[A-Z][A-Za-z0-9]+$/.test(key);

/**
 * Where one keydown goes.  `e` needs key, code, shiftKey, ctrlKey, altKey, metaKey and optionally
 * altGraph / capsLock (getModifierState).  Returns {kind: "code", code}, {kind: "text", text} or
 * {kind: "none"} (dead keys and unidentified keys: the character comes later, as composed text).
 */
export function routeKey(e) {
  const key = e.key || "";
  if (key === "Dead" || key === "Unidentified" || key === "Process" || !e.code) return { kind: "none" };
  if (!key || isNamedKey(key)) return { kind: "code", code: e.code };
  const shortcut = !e.altGraph && (e.ctrlKey || e.altKey || e.metaKey);
  if (shortcut) {
    // the letter the user sees on the key, on the US key that has it (Ctrl+Z on QWERTZ's KeyY is undo)
    return { kind: "code", code: /^[a-zA-Z]$/.test(key) ? `Key${key.toUpperCase()}` : e.code };
  }
  const us = keyForChar(key);
  // a letter's case follows Shift xor CapsLock on both sides (CapsLock goes as a key), so it matches on code
  if (us && us.code === e.code && (us.shift === Boolean(e.shiftKey) || /^[a-zA-Z]$/.test(key))) {
    return { kind: "code", code: e.code };
  }
  return { kind: "text", text: key };
}

/** `text` without control characters, cut into "tx" payloads of at most TEXT_MAX_CHARS code points. */
export function textChunks(text) {
  const chars = Array.from((text || "").replace(/\p{Cc}/gu, ""));
  const out = [];
  for (let i = 0; i < chars.length; i += TEXT_MAX_CHARS) out.push(chars.slice(i, i + TEXT_MAX_CHARS).join(""));
  return out;
}
