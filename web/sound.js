// Mute and volume of the session's sound (the <audio> element that plays the node's Opus track).
//
// Toolbar controls: a mute toggle (aria-pressed) and a volume slider (0..100).  Both are applied to
// the element at once and remembered in localStorage, so the next session starts as the user left it.

export const MUTED_KEY = "rb.muted";
export const VOLUME_KEY = "rb.volume";

function load(key, fallback) {
  try {
    const v = localStorage.getItem(key);
    return v === null ? fallback : v;
  } catch { return fallback; }
}

function save(key, value) {
  try { localStorage.setItem(key, String(value)); } catch { /* private mode: this page only */ }
}

export class SoundControls {
  /**
   * @param {HTMLAudioElement} audio
   * @param {HTMLButtonElement} muteButton
   * @param {HTMLInputElement} volumeInput  type=range, 0..100
   */
  constructor(audio, muteButton, volumeInput) {
    this.audio = audio;
    this.button = muteButton;
    this.slider = volumeInput;
    const volume = Number(load(VOLUME_KEY, "1"));
    this.audio.volume = Number.isFinite(volume) ? Math.min(1, Math.max(0, volume)) : 1;
    this.audio.muted = load(MUTED_KEY, "0") === "1";
    this.button.addEventListener("click", () => this.setMuted(!this.audio.muted));
    this.slider.addEventListener("input", () => this.setVolume(Number(this.slider.value) / 100));
    this.render();
  }

  setMuted(muted) {
    this.audio.muted = Boolean(muted);
    save(MUTED_KEY, this.audio.muted ? "1" : "0");
    this.render();
  }

  setVolume(volume) {
    this.audio.volume = Math.min(1, Math.max(0, volume));
    save(VOLUME_KEY, this.audio.volume);
    if (this.audio.volume > 0 && this.audio.muted) this.setMuted(false); // moving the slider up unmutes
    this.render();
  }

  render() {
    const muted = this.audio.muted || this.audio.volume === 0;
    this.button.setAttribute("aria-pressed", String(this.audio.muted));
    this.button.textContent = muted ? "🔇" : "🔊";
    this.button.title = this.audio.muted ? "Unmute the session's sound" : "Mute the session's sound";
    this.slider.value = String(Math.round(this.audio.volume * 100));
  }
}
