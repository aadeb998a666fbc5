// How long to wait before the next attempt to reconnect: doubling from FIRST_MS up to a
// maximum, with jitter so that many kiosks cut off together do not all come back at once, and
// never sooner than the server asked (Retry-After).

const FIRST_MS = 500;

export class Backoff {
  constructor(maxMs) {
    this.maxMs = maxMs;
    this.attempts = 0;
  }

  /** The wait before the next attempt (ms); `retryAfterS` is the server's Retry-After. */
  next(retryAfterS = null) {
    const ceiling = Math.min(this.maxMs, FIRST_MS * 2 ** this.attempts);
    this.attempts += 1;
    const wait = ceiling / 2 + Math.random() * (ceiling / 2);
    return Math.max(wait, retryAfterS != null ? retryAfterS * 1000 : 0);
  }

  /** A call held: the next loss starts from the shortest wait again. */
  reset() {
    this.attempts = 0;
  }
}
