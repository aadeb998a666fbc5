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
