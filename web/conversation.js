// The conversation as the page sees it: transcript lines, who is speaking, barge-ins and the
// latency of each turn, kept up to date from OpenAI Realtime server events and the level of the
// agent's audio. No DOM here: ui.js draws what this holds.

/** RMS level (linear) above which the agent's audio counts as audible: about -40 dBFS. */
export const AGENT_AUDIO_THRESHOLD = 0.01;
const MAX_LINES = 500;
const MAX_LATENCIES = 100;

/**
 * One call's conversation state.
 *   lines      [{id, role: "caller"|"agent"|"bargein"|"note", text, final, interrupted, version}]
 *   callerSpeaking / agentSpeaking
 *   latencies  [{itemId, ms, source: "level"|"event"}]: caller's speech_stopped -> agent audio
 */
export class Conversation {
  constructor() {
    this.lines = [];
    this.callerSpeaking = false;
    this.agentSpeaking = false;
    this.latencies = [];
    this._lineByKey = new Map(); // "caller:item" / "agent:item" -> line
    this._responses = new Map(); // response id -> {itemId, audioStarted, audioStopped, marked}
    this._marks = new Map(); // agent item id -> its barge-in line
    this._pendingTurn = null; // {itemId, since}: waiting for the agent's first audio
    this._remoteAudible = false;
    this._nextId = 1;
  }

  /** Apply one server event received at `now` (ms, performance.now()). */
  handle(event, now) {
    const handler = HANDLERS[event.type];
    if (handler) handler(this, event, now);
  }

  /** Feed the agent's audio level (linear RMS) sampled at `now`; a rising edge ends a turn. */
  remoteLevel(level, now) {
    const audible = level > AGENT_AUDIO_THRESHOLD;
    if (audible && !this._remoteAudible) this._agentAudioStarted(now, "level");
    this._remoteAudible = audible;
  }

  /** The most recent latency, or null. */
  lastLatency() {
    return this.latencies.length ? this.latencies[this.latencies.length - 1] : null;
  }

  // -- internals used by the event handlers ---------------------------------------------

  _line(role, key, text = "") {
    const mapKey = `${role}:${key}`;
    let line = this._lineByKey.get(mapKey);
    if (!line) {
      line = this._addLine(role, text);
      this._lineByKey.set(mapKey, line);
    }
    return line;
  }

  _addLine(role, text, after = null) {
    const line = { id: this._nextId++, role, text, final: false, interrupted: false, version: 0 };
    const at = after ? this.lines.indexOf(after) : -1;
    if (at >= 0) this.lines.splice(at + 1, 0, line);
    else this.lines.push(line);
    while (this.lines.length > MAX_LINES) {
      const dropped = this.lines.shift();
      for (const [key, value] of this._lineByKey) {
        if (value === dropped) this._lineByKey.delete(key);
      }
    }
    return line;
  }

  _setText(line, text, final) {
    line.text = text;
    line.final = final;
    line.version++;
  }

  _response(id) {
    let response = this._responses.get(id);
    if (!response) {
      response = { itemId: null, audioStarted: false, audioStopped: false, marked: null };
      this._responses.set(id, response);
      if (this._responses.size > MAX_LINES) {
        this._responses.delete(this._responses.keys().next().value);
      }
    }
    return response;
  }

  _responseOfItem(itemId) {
    for (const [id, response] of this._responses) {
      if (response.itemId === itemId) return [id, response];
    }
    return [null, null];
  }

  _agentAudioStarted(now, source) {
    const turn = this._pendingTurn;
    if (!turn) return;
    this._pendingTurn = null;
    this.latencies.push({ itemId: turn.itemId, ms: Math.round(now - turn.since), source });
    if (this.latencies.length > MAX_LATENCIES) this.latencies.shift();
  }

  /** Mark that the caller cut the agent off in `responseId` (once per response). */
  _bargeIn(responseId, itemId, audioEndMs) {
    const response = responseId ? this._response(responseId) : null;
    const key = itemId || (response && response.itemId);
    const agentLine = key ? this._lineByKey.get(`agent:${key}`) : null;
    let mark = (response && response.marked) || (key && this._marks.get(key)) || null;
    if (!mark) {
      mark = this._addLine("bargein", "", agentLine);
      if (agentLine) {
        agentLine.interrupted = true;
        agentLine.version++;
      }
    }
    if (response) response.marked = mark;
    if (key) {
      this._marks.set(key, mark);
      if (this._marks.size > MAX_LINES) this._marks.delete(this._marks.keys().next().value);
    }
    const heard = audioEndMs != null ? ` after ${(audioEndMs / 1000).toFixed(1)} s of audio` : "";
    if (heard || !mark.text) this._setText(mark, `caller interrupted the agent${heard}`, true);
  }
}

/** What each server event does to the conversation. */
const HANDLERS = {
  "input_audio_buffer.speech_started"(c, e) {
    c.callerSpeaking = true;
    c._line("caller", e.item_id, "…");
  },
  "input_audio_buffer.speech_stopped"(c, e, now) {
    c.callerSpeaking = false;
    c._pendingTurn = { itemId: e.item_id, since: now };
  },
  "conversation.item.input_audio_transcription.delta"(c, e) {
    const line = c._line("caller", e.item_id);
    c._setText(line, (line.final || line.text === "…" ? "" : line.text) + (e.delta || ""), false);
  },
  "conversation.item.input_audio_transcription.completed"(c, e) {
    c._setText(c._line("caller", e.item_id), e.transcript || "", true);
  },
  "conversation.item.input_audio_transcription.failed"(c, e) {
    c._setText(c._line("caller", e.item_id), "(transcription failed)", true);
  },
  "response.created"(c, e) {
    if (e.response && e.response.id) c._response(e.response.id);
  },
  "response.output_audio_transcript.delta": agentDelta,
  "response.output_text.delta": agentDelta,
  "response.output_audio_transcript.done": agentDone,
  "response.output_text.done": agentDone,
  "output_audio_buffer.started"(c, e, now) {
    c.agentSpeaking = true;
    if (e.response_id) c._response(e.response_id).audioStarted = true;
    c._agentAudioStarted(now, "event");
  },
  "output_audio_buffer.stopped"(c, e) {
    c.agentSpeaking = false;
    if (e.response_id) c._response(e.response_id).audioStopped = true;
  },
  "output_audio_buffer.cleared"(c, e) {
    // Cleared while playing: the agent was cut off mid-sentence.
    if (c.agentSpeaking) c._bargeIn(e.response_id, null, null);
    c.agentSpeaking = false;
  },
  "conversation.item.truncated"(c, e) {
    const [responseId] = c._responseOfItem(e.item_id);
    c._bargeIn(responseId, e.item_id, e.audio_end_ms);
  },
  "response.done"(c, e) {
    const response = e.response || {};
    const state = response.id ? c._response(response.id) : null;
    // The response is over: its agent line will get no more text (a cut-off one gets no .done).
    const agentLine = state && state.itemId ? c._lineByKey.get(`agent:${state.itemId}`) : null;
    if (agentLine && !agentLine.final) c._setText(agentLine, agentLine.text, true);
    if (response.status === "cancelled") {
      const wasSpeaking = c.agentSpeaking || (state && state.audioStarted && !state.audioStopped);
      if (wasSpeaking) c._bargeIn(response.id, state && state.itemId, null);
      c.agentSpeaking = false;
    } else if (response.status === "failed") {
      const details = response.status_details || {};
      const reason = (details.error && details.error.message) || details.reason || "unknown";
      c._setText(c._addLine("note"), `response failed: ${reason}`, true);
    }
  },
};

function agentDelta(c, e) {
  const key = e.item_id || e.response_id;
  if (e.response_id) c._response(e.response_id).itemId = key;
  const line = c._line("agent", key);
  c._setText(line, line.text + (e.delta || ""), false);
}

function agentDone(c, e) {
  const key = e.item_id || e.response_id;
  if (e.response_id) c._response(e.response_id).itemId = key;
  const text = e.transcript != null ? e.transcript : e.text;
  const line = c._line("agent", key);
  c._setText(line, text != null ? text : line.text, true);
}
