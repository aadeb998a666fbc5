// The voice-chat page: wires one call (rtc.js) to the conversation model (conversation.js),
// the audio level meters (levels.js) and the DOM (ui.js).

import { audioConstraints } from "./config.js";
import { Conversation } from "./conversation.js";
import { StreamLevel } from "./levels.js";
import { RealtimeCall } from "./rtc.js";
import { takeClientSecret } from "./secret.js";
import { summarize, View } from "./ui.js";

const POLL_MS = 20; // level sampling period: the latency figure is accurate to about this
const MAX_DIAGNOSTIC_EVENTS = 1000;

const view = new View(document);
const constraints = audioConstraints(new URLSearchParams(window.location.search));
// The client secret for the next call (secret.js), when the page was given one.
let clientSecret = takeClientSecret(window);
window.addEventListener("hashchange", () => {
  clientSecret = takeClientSecret(window) || clientSecret;
  diagnostics.hasClientSecret = Boolean(clientSecret);
});

/**
 * Test and diagnostic hook, read with page.evaluate() by the browser tests or from the devtools
 * console. The page writes it; nothing reads it back, and it is not an API.
 */
const diagnostics = {
  constraints, // the getUserMedia audio constraints in use
  events: [], // server events of the current call, oldest first (at most 1000)
  state: { connection: "new", ice: "new", signaling: "stable", channel: "none" },
  levels: { mic: 0, remote: 0, maxMic: 0, maxRemote: 0 }, // linear RMS, 0..1
  latencies: [], // [{itemId, ms, source}] caller's speech_stopped -> first agent audio
  transcript: [], // [{role, text, final, interrupted}]
  callUrl: null, // the call's Location while it lasts
  ended: null, // why the last call ended
  lastError: null, // {code, message} of the last failure
  hasClientSecret: Boolean(clientSecret), // whether the next call has a secret (never the value)
};
window.omnivox = diagnostics;

/** The call in progress, with everything the page keeps about it. */
class PageCall {
  constructor() {
    this.startedAt = performance.now();
    this.conversation = new Conversation();
    // Created from the click handler, so browsers that want a user gesture let it run.
    this.audio = new AudioContext();
    this.mic = null;
    this.remote = null;
    this.latencyCount = 0;
    this.call = new RealtimeCall(
      {
        onEvent: (event) => this.onEvent(event),
        onState: (state) => this.onState(state),
        onLocalStream: (stream) => {
          this.mic = new StreamLevel(this.audio, stream);
        },
        onRemoteStream: (stream) => this.onRemoteStream(stream),
        onEnded: (reason) => this.onEnded(reason),
      },
      clientSecret,
    );
    this.timer = setInterval(() => this.tick(), POLL_MS);
  }

  async start() {
    this.audio.resume().catch(() => {});
    this.log("local", "call.connecting", "asking for the microphone");
    await this.call.start(constraints);
    if (this.call.location) {
      // The server took the secret for this call: it cannot place another.
      clientSecret = null;
      diagnostics.hasClientSecret = false;
    }
    if (this.call.ended) return;
    diagnostics.callUrl = this.call.location;
    this.log("local", "call.answered", this.call.location || "");
  }

  hangUp(reason) {
    return this.call.hangUp(reason);
  }

  seconds() {
    return (performance.now() - this.startedAt) / 1000;
  }

  log(direction, type, detail = "") {
    view.log(this.seconds(), direction, type, detail);
  }

  onEvent(event) {
    const now = performance.now();
    diagnostics.events.push(event);
    if (diagnostics.events.length > MAX_DIAGNOSTIC_EVENTS) diagnostics.events.shift();
    this.log("in", event.type, summarize(event));
    this.conversation.handle(event, now);
    this.render();
  }

  onState(state) {
    const previous = diagnostics.state;
    diagnostics.state = state;
    view.setStates(state);
    for (const name of Object.keys(state)) {
      if (state[name] !== previous[name]) this.log("local", `${name}.state`, state[name]);
    }
    if (state.connection === "connected") view.setStatus("In call", "ok");
    else if (state.connection === "disconnected") view.setStatus("Connection interrupted…", "busy");
  }

  onRemoteStream(stream) {
    if (this.remote) return;
    // Attach first: Chromium's Web Audio sees silence from a remote stream that no media
    // element plays.
    view.remoteAudio.srcObject = stream;
    view.remoteAudio.play().catch((error) => this.log("error", "audio.play", error.message));
    this.remote = new StreamLevel(this.audio, stream);
  }

  onEnded(reason) {
    clearInterval(this.timer);
    for (const meter of [this.mic, this.remote]) if (meter) meter.disconnect();
    this.audio.close().catch(() => {});
    view.remoteAudio.srcObject = null;
    this.conversation.callerSpeaking = this.conversation.agentSpeaking = false;
    this.render();
    view.setLevels(0, 0);
    view.setCallButton("connect");
    if (!diagnostics.lastError) view.setStatus(`Call ended: ${reason}`, "idle");
    diagnostics.callUrl = null;
    diagnostics.ended = reason;
    diagnostics.levels.mic = diagnostics.levels.remote = 0;
    this.log("local", "call.ended", reason);
    if (current === this) current = null;
  }

  /** Sample both levels; the agent's level also ends a turn's latency measurement. */
  tick() {
    const now = performance.now();
    const mic = this.mic ? this.mic.read() : 0;
    const remote = this.remote ? this.remote.read() : 0;
    const levels = diagnostics.levels;
    levels.mic = mic;
    levels.remote = remote;
    levels.maxMic = Math.max(levels.maxMic, mic);
    levels.maxRemote = Math.max(levels.maxRemote, remote);
    view.setLevels(mic, remote);
    this.conversation.remoteLevel(remote, now);
    if (this.conversation.latencies.length !== this.latencyCount) this.render();
  }

  render() {
    const c = this.conversation;
    view.renderTranscript(c.lines);
    view.setSpeaking(c.callerSpeaking, c.agentSpeaking);
    if (c.latencies.length !== this.latencyCount) {
      this.latencyCount = c.latencies.length;
      view.setLatencies(c.latencies);
      const last = c.lastLatency();
      this.log("local", "latency", `${last.ms} ms (${last.source})`);
    }
    diagnostics.latencies = c.latencies.slice();
    diagnostics.transcript = c.lines.map(({ role, text, final, interrupted }) => ({
      role,
      text,
      final,
      interrupted,
    }));
  }
}

let current = null;

async function connect() {
  view.resetCall();
  view.setCallButton("connecting");
  view.setStatus("Connecting…", "busy");
  Object.assign(diagnostics, {
    events: [],
    latencies: [],
    transcript: [],
    ended: null,
    lastError: null,
    levels: { mic: 0, remote: 0, maxMic: 0, maxRemote: 0 },
  });
  let call = null;
  try {
    call = new PageCall();
    current = call;
    await call.start();
    if (!call.call.ended) view.setCallButton("hangup");
  } catch (error) {
    const code = error.code || error.name || "error";
    diagnostics.lastError = { code, message: error.message };
    view.log(call ? call.seconds() : 0, "error", code, error.message);
    const hint =
      error.status === 401
        ? " (this server needs a client secret: open the page through your deployment's link)"
        : "";
    view.setStatus(`Could not connect: ${error.message}${hint}`, "error");
    if (call) await call.hangUp("failed to connect");
    else view.setCallButton("connect");
  }
}

view.setProcessing(constraints);
view.setCallButton("connect");
view.callButton.addEventListener("click", () => {
  if (current) current.hangUp("hung up");
  else connect();
});
// Leaving the page ends the call on the server too (the DELETE is sent with keepalive).
window.addEventListener("pagehide", () => {
  if (current) current.hangUp("page closed");
});
