// The kiosk page: a voice agent on an unattended screen. It places a call on load, shows large
// live captions of both sides and what the agent is doing, and never needs anyone at the
// screen: a lost connection or a restarted server is reconnected with back-off (resuming the
// conversation when the server still holds it), and after a few minutes of silence the
// conversation starts over for the next visitor. Settings come from the URL (config.js).

import { Backoff } from "./backoff.js";
import { audioConstraints, kioskSettings } from "./config.js";
import { Conversation } from "./conversation.js";
import { StreamLevel } from "./levels.js";
import { RealtimeCall } from "./rtc.js";
import { takeClientSecret } from "./secret.js";
import { View } from "./ui.js";

const RESUME_HEADER = "Omnivox-Resume-Token"; // agent/calls/signalling.py
const DROP_AFTER_MS = 4000; // a connection "disconnected" this long is given up
const CONNECT_TIMEOUT_MS = 20_000; // a call not up by then is given up
const CAPTION_LINES = 6;
const TICK_MS = 100;
const MAX_DIAGNOSTIC_EVENTS = 300;
const RESET = "reset"; // the reason a call is hung up after the silence
// getUserMedia's refusals: said on the screen (docs/kiosk.md: the browser's flags), retried.
const MICROPHONE_ERRORS = ["NotAllowedError", "NotFoundError", "NotReadableError"];
const PHASES = {
  connecting: "Connecting…",
  reconnecting: "Reconnecting…",
  listening: "Listening",
  thinking: "Thinking…",
  speaking: "Speaking",
};
// Server events that show someone is talking to the kiosk (the silence clock starts again).
const ACTIVITY = /^(input_audio_buffer\.(speech_started|committed)|response\.|output_audio_buffer)/;

const query = new URLSearchParams(window.location.search);
const settings = kioskSettings(query);
const constraints = audioConstraints(query);
const view = new View(document); // only its transcript (the captions) and audio element here
const phaseBox = document.getElementById("phase");
const phaseText = document.getElementById("phase-text");
const hint = document.getElementById("hint");
const audio = new AudioContext(); // for the microphone's level; runs once autoplay allows
const backoff = new Backoff(settings.retryMaxMs);
let fragmentSecret = takeClientSecret(window); // good for the first call only

/** Test and diagnostic hook (read by tests/test_kiosk.py and from the devtools); not an API. */
const diagnostics = {
  settings,
  phase: "connecting",
  calls: 0, // calls placed
  resumed: 0, // calls that went on with a dropped call's conversation
  conversations: 0, // conversations started afresh (the first one included)
  replies: 0, // response.done events received
  connected: false,
  events: [], // server events of the calls, oldest first (bounded)
  transcript: [], // [{role, text, final}]
  lastError: null, // {code, message} of the last failed attempt
  ended: null, // why the last call ended
};
window.omnivox = diagnostics;

let conversation = null;
let resumeToken = null; // the current call's, from its session.created
let thinking = false;
let lastActivity = performance.now();
let current = null;
let reconnecting = false; // a call was lost and none is up again yet

/** A fresh conversation: empty captions, nothing to resume. */
function startOver() {
  conversation = new Conversation();
  resumeToken = null;
  thinking = false;
  diagnostics.conversations += 1;
  render();
}

/** One call of the kiosk; `done` resolves with the reason it ended. */
class KioskCall {
  constructor(secret, headers) {
    this.resuming = Boolean(headers[RESUME_HEADER]);
    this.placedAt = performance.now();
    this.connected = false;
    this.dropTimer = null;
    this.mic = null;
    this.done = new Promise((resolve) => {
      this.resolve = resolve;
    });
    this.call = new RealtimeCall(
      {
        onEvent: (event) => this.onEvent(event),
        onState: (state) => this.onState(state),
        onLocalStream: (stream) => {
          this.mic = new StreamLevel(audio, stream);
        },
        onRemoteStream: (stream) => playAgent(stream),
        onEnded: (reason) => this.onEnded(reason),
      },
      secret,
      headers,
    );
  }

  onEvent(event) {
    diagnostics.events.push(event);
    if (diagnostics.events.length > MAX_DIAGNOSTIC_EVENTS) diagnostics.events.shift();
    if (event.type === "session.created") {
      this.connected = diagnostics.connected = true;
      reconnecting = false;
      resumeToken = (event.resume && event.resume.token) || null;
      if (this.resuming) diagnostics.resumed += 1;
      backoff.reset();
      lastActivity = performance.now();
    }
    if (ACTIVITY.test(event.type)) lastActivity = performance.now();
    if (event.type === "response.done") diagnostics.replies += 1;
    if (event.type === "input_audio_buffer.committed" || event.type === "response.created") {
      thinking = true;
    } else if (
      ["output_audio_buffer.started", "response.done", "input_audio_buffer.speech_started"].
        includes(event.type)
    ) {
      thinking = false;
    }
    conversation.handle(event, performance.now());
    render();
  }

  onState(state) {
    if (state.connection === "disconnected" && this.dropTimer === null) {
      this.dropTimer = setTimeout(() => this.call.abandon("connection lost"), DROP_AFTER_MS);
    } else if (state.connection !== "disconnected" && this.dropTimer !== null) {
      clearTimeout(this.dropTimer);
      this.dropTimer = null;
    }
  }

  onEnded(reason) {
    clearTimeout(this.dropTimer);
    if (this.mic) this.mic.disconnect();
    view.remoteAudio.srcObject = null;
    diagnostics.connected = false;
    diagnostics.ended = reason;
    reconnecting = reason !== RESET;
    conversation.callerSpeaking = conversation.agentSpeaking = false;
    thinking = false;
    render();
    this.resolve(reason);
  }

  /** Called every tick: give up a call that never came up; start over after the silence. */
  tick(now) {
    if (!this.connected && now - this.placedAt > CONNECT_TIMEOUT_MS) {
      this.call.abandon("connect timeout");
      return;
    }
    const busy = conversation.agentSpeaking || conversation.callerSpeaking || thinking;
    if (busy) lastActivity = now;
    const said = conversation.lines.length > 0;
    if (this.connected && said && settings.resetMs > 0 && now - lastActivity > settings.resetMs) {
      startOver(); // the server forgets it too: the hang-up is not a drop
      this.call.hangUp(RESET);
    }
  }
}

/** The client secret for the next call: the page's own once, then the deployer's mint. */
async function nextSecret() {
  if (fragmentSecret) {
    const secret = fragmentSecret;
    fragmentSecret = null;
    return secret;
  }
  if (!settings.mintUrl) return null; // a server without API keys needs none
  const reply = await fetch(settings.mintUrl, { method: "POST", credentials: "same-origin" });
  if (!reply.ok) throw Object.assign(new Error(`mint: ${reply.status}`), { code: "mint_failed" });
  const body = await reply.json();
  const value = body.value || (body.client_secret && body.client_secret.value);
  if (!value) throw Object.assign(new Error("mint: no secret"), { code: "mint_failed" });
  return value;
}

/** Place one call and wait for it to end; throws when it could not be placed. */
async function placeCall() {
  const secret = await nextSecret();
  const headers = resumeToken ? { [RESUME_HEADER]: resumeToken } : {};
  current = new KioskCall(secret, headers);
  diagnostics.calls += 1;
  try {
    await current.call.start(constraints);
  } catch (error) {
    current.call.abandon("failed to connect");
    throw error;
  }
  return current.done;
}

/** Call after call, for as long as the page is open. */
async function run() {
  startOver();
  for (;;) {
    let wait;
    try {
      const reason = await placeCall();
      if (reason === RESET) continue;
      wait = backoff.next();
    } catch (error) {
      diagnostics.lastError = { code: error.code || error.name || "error", message: error.message };
      if (error.code === "resume_expired") {
        startOver(); // the server no longer holds the conversation: a new one, at once
        continue;
      }
      if (MICROPHONE_ERRORS.includes(error.name)) showHint(`No microphone: ${error.message}`);
      wait = backoff.next(error.retryAfterS);
    }
    current = null;
    render();
    await new Promise((resolve) => setTimeout(resolve, wait));
  }
}

function playAgent(stream) {
  // Chromium plays (and analyses) a remote stream only through a media element.
  view.remoteAudio.srcObject = stream;
  view.remoteAudio.play().then(hideHint, () => showHint("Touch the screen to turn the sound on"));
}

function showHint(text) {
  hint.textContent = text;
  hint.hidden = false;
}

function hideHint() {
  hint.hidden = true;
}

function phase() {
  if (!current || !current.connected) return reconnecting ? "reconnecting" : "connecting";
  if (conversation.agentSpeaking) return "speaking";
  return thinking ? "thinking" : "listening";
}

function render() {
  const now = phase();
  if (now !== diagnostics.phase || phaseBox.dataset.phase !== now) {
    diagnostics.phase = now;
    phaseBox.dataset.phase = now;
    phaseText.textContent = PHASES[now];
  }
  view.renderTranscript(conversation.lines.slice(-CAPTION_LINES));
  diagnostics.transcript = conversation.lines.map(({ role, text, final }) => ({ role, text, final }));
}

setInterval(() => {
  const now = performance.now();
  if (current) current.tick(now);
  const level = current && current.mic ? current.mic.read() : 0;
  phaseBox.style.setProperty("--level", Math.min(1, level * 8).toFixed(2));
  render();
}, TICK_MS);

// Only without the kiosk's autoplay flag (docs/kiosk.md): one touch lets the sound play.
document.addEventListener("click", () => {
  audio.resume().catch(() => {});
  view.remoteAudio.play().then(hideHint, () => {});
});
window.addEventListener("pagehide", () => {
  if (current) current.call.hangUp("page closed");
});
run();
