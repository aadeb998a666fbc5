// Audio levels of media streams, read with Web Audio AnalyserNodes.

const FFT_SIZE = 1024; // about 21 ms of audio at 48 kHz: one reading per 20 ms poll
const FLOOR_DB = -60;

/** The RMS level (linear, 0..1) of one MediaStream's audio, read on demand. */
export class StreamLevel {
  constructor(context, stream) {
    this.source = context.createMediaStreamSource(stream);
    this.analyser = context.createAnalyser();
    this.analyser.fftSize = FFT_SIZE;
    this.samples = new Float32Array(this.analyser.fftSize);
    // Analysis only: the node is not connected to the destination, so nothing is played twice.
    this.source.connect(this.analyser);
  }

  /** RMS of the most recent FFT_SIZE samples. */
  read() {
    this.analyser.getFloatTimeDomainData(this.samples);
    let sum = 0;
    for (let i = 0; i < this.samples.length; i++) sum += this.samples[i] * this.samples[i];
    return Math.sqrt(sum / this.samples.length);
  }

  disconnect() {
    this.source.disconnect();
    this.analyser.disconnect();
  }
}

/** A linear level as a 0..1 meter position on a FLOOR_DB..0 dBFS scale. */
export function meterPosition(level) {
  if (level <= 0) return 0;
  const db = 20 * Math.log10(level);
  return Math.min(1, Math.max(0, (db - FLOOR_DB) / -FLOOR_DB));
}

/** A linear level in dBFS, for display. */
export function toDb(level) {
  return level > 0 ? 20 * Math.log10(level) : -Infinity;
}
