// Page settings read from the URL query.
//
//   ?raw=1                      microphone without echo cancellation, noise suppression or
//                               automatic gain control (what tests use: the audio reaching the
//                               server then matches the file the fake microphone plays)
//   ?echoCancellation=0|1       each one on its own; overrides raw
//   ?noiseSuppression=0|1
//   ?autoGainControl=0|1

const PROCESSING = ["echoCancellation", "noiseSuppression", "autoGainControl"];

/** getUserMedia audio constraints for this page's URL query (URLSearchParams). */
export function audioConstraints(query) {
  const base = !isOn(query.get("raw"));
  const constraints = { channelCount: 1 };
  for (const name of PROCESSING) {
    const value = query.get(name);
    constraints[name] = value === null ? base : isOn(value);
  }
  return constraints;
}

function isOn(value) {
  return value !== null && ["1", "true", "yes", "on", ""].includes(value.toLowerCase());
}

// The kiosk page's own settings (kiosk.html), also from the URL query:
//
//   ?mint=URL                   a deployer's endpoint that mints a client secret for each call
//                               (POSTed to, answers {"value": "ek_..."} as the server's
//                               /v1/realtime/client_secrets does); needed to reconnect to a
//                               server with API keys, where one secret places one call
//   ?reset_min=N                minutes of silence after which the conversation starts over
//                               (default 2; 0: never)
//   ?retry_max_s=N              the longest wait between reconnection attempts (default 30)

/** The kiosk's settings for this page's URL query (URLSearchParams). */
export function kioskSettings(query) {
  return {
    mintUrl: query.get("mint") || null,
    resetMs: positive(query.get("reset_min"), 2) * 60_000,
    retryMaxMs: positive(query.get("retry_max_s"), 30) * 1000,
  };
}

function positive(value, fallback) {
  const number = Number.parseFloat(value);
  return Number.isFinite(number) && number >= 0 ? number : fallback;
}
