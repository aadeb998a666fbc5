// The page's DOM: what each part of index.html shows, and nothing about calls or events.

import { meterPosition, toDb } from "./levels.js";

const MAX_LOG_LINES = 300;
const RECENT_LATENCIES = 5;
const ROLE_LABELS = { caller: "You", agent: "Agent", bargein: "", note: "" };

/** The voice-chat page's elements and how to update them. */
export class View {
  constructor(doc) {
    const $ = (id) => doc.getElementById(id);
    this.doc = doc;
    this.callButton = $("call-button");
    this.status = $("status");
    this.states = {
      connection: $("state-connection"),
      ice: $("state-ice"),
      signaling: $("state-signaling"),
      channel: $("state-channel"),
    };
    this.micMeter = $("mic-meter");
    this.micDb = $("mic-db");
    this.remoteMeter = $("remote-meter");
    this.remoteDb = $("remote-db");
    this.callerSpeaking = $("caller-speaking");
    this.agentSpeaking = $("agent-speaking");
    this.latencyLast = $("latency-last");
    this.latencyList = $("latency-list");
    this.processing = $("processing");
    this.transcript = $("transcript");
    this.logList = $("log");
    this.remoteAudio = $("remote-audio");
    this._transcriptItems = new Map(); // line id -> {li, version}
  }

  /** mode: "connect" | "connecting" | "hangup" */
  setCallButton(mode) {
    const labels = { connect: "Connect", connecting: "Cancel", hangup: "Hang up" };
    this.callButton.dataset.mode = mode;
    this.callButton.textContent = labels[mode];
  }

  /** kind: "idle" | "busy" | "ok" | "error" */
  setStatus(text, kind = "idle") {
    this.status.textContent = text;
    this.status.dataset.kind = kind;
  }

  setStates(state) {
    for (const [name, element] of Object.entries(this.states)) {
      const value = state[name] || "none";
      element.textContent = value;
      element.dataset.state = value;
    }
  }

  setLevels(mic, remote) {
    showLevel(this.micMeter, this.micDb, mic);
    showLevel(this.remoteMeter, this.remoteDb, remote);
  }

  setSpeaking(caller, agent) {
    this.callerSpeaking.dataset.on = String(caller);
    this.agentSpeaking.dataset.on = String(agent);
  }

  setLatencies(latencies) {
    const last = latencies[latencies.length - 1];
    this.latencyLast.textContent = last ? `${last.ms} ms` : "–";
    this.latencyLast.title = last ? `measured from ${sourceText(last.source)}` : "";
    const recent = latencies.slice(-RECENT_LATENCIES).reverse();
    this.latencyList.replaceChildren(
      ...recent.map((l) => this._element("li", `${l.ms} ms · ${sourceText(l.source)}`)),
    );
  }

  setProcessing(constraints) {
    const names = ["echoCancellation", "noiseSuppression", "autoGainControl"];
    const on = names.filter((n) => constraints[n]);
    this.processing.textContent = on.length
      ? `Microphone processing: ${on.join(", ")}`
      : "Microphone processing: off (raw audio)";
  }

  /** Bring the transcript list in line with `lines`, touching only lines that changed. */
  renderTranscript(lines) {
    const follow = isAtEnd(this.transcript);
    const keep = new Set();
    let previous = null;
    for (const line of lines) {
      keep.add(line.id);
      let entry = this._transcriptItems.get(line.id);
      if (!entry) {
        entry = { li: this._transcriptLine(line), version: -1 };
        this._transcriptItems.set(line.id, entry);
        if (previous) previous.after(entry.li);
        else this.transcript.prepend(entry.li);
      }
      if (entry.version !== line.version) {
        entry.li.querySelector(".text").textContent = line.text;
        entry.li.dataset.final = String(line.final);
        entry.li.dataset.interrupted = String(line.interrupted);
        entry.version = line.version;
      }
      previous = entry.li;
    }
    for (const [id, entry] of this._transcriptItems) {
      if (!keep.has(id)) {
        entry.li.remove();
        this._transcriptItems.delete(id);
      }
    }
    if (follow) scrollToEnd(this.transcript);
  }

  /** Append one line to the event log (newest last, at most MAX_LOG_LINES). */
  log(seconds, direction, type, detail = "") {
    const follow = isAtEnd(this.logList);
    const li = this.doc.createElement("li");
    li.dataset.direction = direction;
    li.append(
      this._element("time", `+${seconds.toFixed(3)}`),
      this._element("span", direction === "in" ? "↓" : direction === "out" ? "↑" : "•", "dir"),
      this._element("span", type, "type"),
      this._element("span", detail, "detail"),
    );
    if (type === "error" || direction === "error") li.classList.add("error");
    this.logList.append(li);
    while (this.logList.childElementCount > MAX_LOG_LINES) this.logList.firstElementChild.remove();
    if (follow) scrollToEnd(this.logList);
  }

  /** Clear what belongs to one call (the log stays, it is the page's history). */
  resetCall() {
    this.setLevels(0, 0);
    this.setSpeaking(false, false);
    this.transcript.replaceChildren();
    this._transcriptItems.clear();
    this.setLatencies([]);
  }

  _transcriptLine(line) {
    const li = this.doc.createElement("li");
    li.className = `line ${line.role}`;
    const label = ROLE_LABELS[line.role];
    if (label) li.append(this._element("span", label, "who"));
    li.append(this._element("span", "", "text"));
    return li;
  }

  _element(tag, text, className = "") {
    const element = this.doc.createElement(tag);
    element.textContent = text;
    if (className) element.className = className;
    return element;
  }
}

/** One-line summary of a server event's interesting fields, for the log. */
export function summarize(event) {
  switch (event.type) {
    case "session.created":
      return event.session ? `session ${event.session.id || ""}` : "";
    case "input_audio_buffer.speech_started":
      return `audio_start_ms=${event.audio_start_ms}`;
    case "input_audio_buffer.speech_stopped":
      return `audio_end_ms=${event.audio_end_ms}`;
    case "conversation.item.truncated":
      return `audio_end_ms=${event.audio_end_ms}`;
    case "conversation.item.input_audio_transcription.completed":
    case "response.output_audio_transcript.done":
      return JSON.stringify(event.transcript || "");
    case "conversation.item.input_audio_transcription.delta":
    case "response.output_audio_transcript.delta":
    case "response.output_text.delta":
      return JSON.stringify(event.delta || "");
    case "response.done":
      return event.response ? `status=${event.response.status}` : "";
    case "error":
      return event.error ? `${event.error.code}: ${event.error.message}` : "";
    default:
      return "";
  }
}

function showLevel(fill, label, level) {
  fill.style.transform = `scaleX(${meterPosition(level)})`;
  const db = toDb(level);
  label.textContent = db === -Infinity || db < -99 ? "–∞ dB" : `${db.toFixed(0)} dB`;
}

function sourceText(source) {
  return source === "level" ? "audio level" : "output_audio_buffer.started";
}

function isAtEnd(element) {
  return element.scrollHeight - element.scrollTop - element.clientHeight < 40;
}

function scrollToEnd(element) {
  element.scrollTop = element.scrollHeight;
}
