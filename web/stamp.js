// Frame stamps: the render node's built-in game renderer (streamer/desktop/game.py) draws, in a top strip
// of big black/white cells, each frame's number and its render time (ms since the epoch) with a CRC.
// Reading it back from the displayed frame gives glass-to-glass latency: display time - render time
// (meaningful when the node's clock and this machine's clock agree, e.g. NTP or the same host).
//
// Layout (relative to the frame width, so scaling keeps it): STAMP_COLUMNS x STAMP_ROWS square
// cells of width / STAMP_COLUMNS px; bits row-major, MSB first:
//   sync (8) | frame number (32) | ts_ms (48) | crc16 (16) | tail (16);  white = 1.
// crc16 = CRC-32 (zlib) of frame number (4 bytes BE) + ts_ms (6 bytes BE), low 16 bits.
// Pure functions only; client.js samples the pixels.

export const STAMP_COLUMNS = 40;
export const STAMP_ROWS = 3;
export const STAMP_SYNC = 0b1011_0001;
export const STAMP_TAIL = 0x5ac3;
const BITS = STAMP_COLUMNS * STAMP_ROWS; // 120

/** Height in pixels of the stamp strip of a frame `width` pixels wide. */
export function stampHeight(width) {
  return Math.round((STAMP_ROWS * width) / STAMP_COLUMNS);
}

let crcTable = null;
/** zlib's CRC-32 of a byte array (unsigned 32-bit result). */
export function crc32(bytes) {
  if (!crcTable) {
    crcTable = new Uint32Array(256);
    for (let n = 0; n < 256; n++) {
      let c = n;
      for (let k = 0; k < 8; k++) c = c & 1 ? 0xedb88320 ^ (c >>> 1) : c >>> 1;
      crcTable[n] = c >>> 0;
    }
  }
  let crc = 0xffffffff;
  for (const b of bytes) crc = crcTable[(crc ^ b) & 0xff] ^ (crc >>> 8);
  return (crc ^ 0xffffffff) >>> 0;
}

function bytesBE(value, count) {
  const out = [];
  let v = BigInt(value);
  for (let i = 0; i < count; i++) { out.unshift(Number(v & 0xffn)); v >>= 8n; }
  return out;
}

/** {frameNo, tsMs} from the 120 cell bits (row-major, 0/1), or null when sync, tail or CRC do not match. */
export function parseStamp(bits) {
  if (!bits || bits.length !== BITS) return null;
  let w = 0n;
  for (const b of bits) w = (w << 1n) | (b ? 1n : 0n);
  const tail = Number(w & 0xffffn);
  const crc = Number((w >> 16n) & 0xffffn);
  const ts = (w >> 32n) & ((1n << 48n) - 1n);
  const frame = (w >> 80n) & 0xffffffffn;
  const sync = Number(w >> 112n);
  if (sync !== STAMP_SYNC || tail !== STAMP_TAIL) return null;
  if ((crc32([...bytesBE(frame, 4), ...bytesBE(ts, 6)]) & 0xffff) !== crc) return null;
  return { frameNo: Number(frame), tsMs: Number(ts) };
}

/**
 * Cell bits from RGBA pixels of the strip scaled to (STAMP_COLUMNS * scale) x (STAMP_ROWS * scale):
 * each cell is judged by the mean grey of its central half (robust to blur and ringing).
 */
export function cellBits(rgba, scale) {
  const width = STAMP_COLUMNS * scale;
  const lo = Math.floor(scale / 4), hi = Math.max(lo + 1, scale - Math.floor(scale / 4));
  const bits = new Array(BITS);
  for (let row = 0; row < STAMP_ROWS; row++) {
    for (let col = 0; col < STAMP_COLUMNS; col++) {
      let sum = 0, n = 0;
      for (let y = row * scale + lo; y < row * scale + hi; y++) {
        for (let x = col * scale + lo; x < col * scale + hi; x++) {
          const i = (y * width + x) * 4;
          sum += (rgba[i] + rgba[i + 1] + rgba[i + 2]) / 3;
          n += 1;
        }
      }
      bits[row * STAMP_COLUMNS + col] = sum / n >= 128 ? 1 : 0;
    }
  }
  return bits;
}

/** The median of a list of numbers (null when empty). */
export function median(values) {
  if (!values.length) return null;
  const s = [...values].sort((a, b) => a - b);
  const m = s.length >> 1;
  return s.length % 2 ? s[m] : (s[m - 1] + s[m]) / 2;
}
