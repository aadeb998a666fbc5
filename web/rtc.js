// A voice call to omnivox over WebRTC: the microphone goes out, the agent's voice comes back,
// and OpenAI Realtime events travel both ways on the `oai-events` data channel.
//
// Signalling is OpenAI's Realtime WebRTC shape: POST the offer SDP to /v1/realtime/calls,
// get the answer SDP and a Location to DELETE when hanging up. When the server requires
// authentication, both requests carry the call's client secret as a Bearer token.

export const EVENTS_CHANNEL = "oai-events";
const CALLS_URL = "/v1/realtime/calls";
const ICE_GATHERING_TIMEOUT_MS = 2000;
const HANG_UP_TIMEOUT_MS = 3000;

/** A refused or failed request, with the server's error code when it sent one. */
export class CallError extends Error {
  constructor(message, code = "call_failed", status = 0, retryAfterS = null) {
    super(message);
    this.code = code;
    this.status = status;
    this.retryAfterS = retryAfterS; // the server's Retry-After, when it sent one
  }
}

/**
 * One call. Callbacks (all optional):
 *   onEvent(event)            a server event arrived (parsed JSON)
 *   onState(state)            {connection, ice, signaling, channel} changed
 *   onLocalStream(stream)     the microphone stream, once granted
 *   onRemoteStream(stream)    the agent's audio stream
 *   onEnded(reason)           the call is over (hang-up, server close or failure); called once
 * `clientSecret` (optional): the Bearer token for the server's signalling requests.
 * `offerHeaders` (optional): more headers for the offer, e.g. a dropped call's resume token.
 */
export class RealtimeCall {
  constructor(callbacks = {}, clientSecret = null, offerHeaders = {}) {
    this.callbacks = callbacks;
    this.auth = clientSecret ? { Authorization: `Bearer ${clientSecret}` } : {};
    this.offerHeaders = offerHeaders;
    this.pc = null;
    this.channel = null;
    this.localStream = null;
    this.location = null;
    this.ended = false;
    this.hangingUp = null; // the reason, while the DELETE is in flight
  }

  /** Ask for the microphone with `audioConstraints`, negotiate, and start the call. */
  async start(audioConstraints) {
    const stream = await navigator.mediaDevices.getUserMedia({ audio: audioConstraints });
    if (this.ended) {
      // Hung up while the browser was asking for the microphone.
      for (const track of stream.getTracks()) track.stop();
      return;
    }
    this.localStream = stream;
    this._emit("onLocalStream", stream);
    const pc = new RTCPeerConnection({ iceServers: [] });
    this.pc = pc;
    for (const track of this.localStream.getAudioTracks()) pc.addTrack(track, this.localStream);
    pc.ontrack = (e) => this._emit("onRemoteStream", e.streams[0] || new MediaStream([e.track]));
    pc.onconnectionstatechange = () => this._onPeerState();
    pc.oniceconnectionstatechange = () => this._reportState();
    pc.onsignalingstatechange = () => this._reportState();
    this._openChannel(pc.createDataChannel(EVENTS_CHANNEL));

    await pc.setLocalDescription(await pc.createOffer());
    await waitForIceGathering(pc, ICE_GATHERING_TIMEOUT_MS);
    if (this.ended) return;
    const reply = await fetch(CALLS_URL, {
      method: "POST",
      headers: { "Content-Type": "application/sdp", ...this.offerHeaders, ...this.auth },
      body: pc.localDescription.sdp,
    });
    if (reply.status !== 201) throw await errorFrom(reply);
    const location = reply.headers.get("Location");
    const callUrl = location ? new URL(location, window.location.href).toString() : null;
    const answer = await reply.text();
    if (this.ended) {
      // Hung up while the offer was in flight: the server has the call, so end it there too.
      if (callUrl) {
        await fetch(callUrl, { method: "DELETE", headers: this.auth, keepalive: true }).catch(
          () => {},
        );
      }
      return;
    }
    this.location = callUrl;
    await pc.setRemoteDescription({ type: "answer", sdp: answer });
  }

  /** Send a client event (an object) on the data channel; false when it is not open. */
  send(event) {
    if (!this.channel || this.channel.readyState !== "open") return false;
    this.channel.send(JSON.stringify(event));
    return true;
  }

  /** Hang up: tell the server, then stop the microphone and close the peer connection. */
  async hangUp(reason = "hung up") {
    if (this.ended) return;
    const location = this.location;
    this.location = null;
    this.hangingUp = reason;
    if (location) {
      // The DELETE goes first: closing the peer connection first would make the server end
      // the call by itself, and the DELETE would find no call. keepalive lets it finish
      // while the page is being closed.
      await fetch(location, {
        method: "DELETE",
        headers: this.auth,
        keepalive: true,
        signal: AbortSignal.timeout(HANG_UP_TIMEOUT_MS),
      }).catch(() => {});
    }
    this._end(reason);
  }

  /** Give the call up here without telling the server (its connection is gone): the server
   * keeps the conversation for a while, for a new call to resume. */
  abandon(reason = "connection lost") {
    this._end(reason);
  }

  state() {
    const pc = this.pc;
    return {
      connection: pc ? pc.connectionState : "new",
      ice: pc ? pc.iceConnectionState : "new",
      signaling: pc ? pc.signalingState : "stable",
      channel: this.channel ? this.channel.readyState : "none",
    };
  }

  _openChannel(channel) {
    this.channel = channel;
    channel.onopen = () => this._reportState();
    channel.onclose = () => {
      this._reportState();
      // The server closing the channel means the call is over on its side.
      if (!this.ended) this._end(this.hangingUp || "ended by the server");
    };
    channel.onmessage = (e) => {
      let event;
      try {
        event = JSON.parse(e.data);
      } catch {
        event = { type: "client.invalid_message", data: String(e.data).slice(0, 200) };
      }
      this._emit("onEvent", event);
    };
  }

  _onPeerState() {
    this._reportState();
    const state = this.pc && this.pc.connectionState;
    if (!this.ended && (state === "failed" || state === "closed")) {
      this._end(this.hangingUp || `connection ${state}`);
    }
  }

  _reportState() {
    this._emit("onState", this.state());
  }

  _end(reason) {
    if (this.ended) return;
    this.ended = true;
    if (this.localStream) for (const track of this.localStream.getTracks()) track.stop();
    if (this.channel) this.channel.onclose = null;
    if (this.pc) {
      this.pc.close();
      // close() fires no state events; report the final state ourselves.
      this._emit("onState", { ...this.state(), connection: "closed", channel: "closed" });
    }
    this.location = null;
    this._emit("onEnded", reason);
  }

  _emit(name, value) {
    const callback = this.callbacks[name];
    if (callback) callback(value);
  }
}

/** Resolve once the offer carries its candidates (non-trickle signalling), or after `ms`. */
function waitForIceGathering(pc, ms) {
  if (pc.iceGatheringState === "complete") return Promise.resolve();
  return new Promise((resolve) => {
    const timer = setTimeout(done, ms);
    function done() {
      clearTimeout(timer);
      pc.removeEventListener("icegatheringstatechange", check);
      resolve();
    }
    function check() {
      if (pc.iceGatheringState === "complete") done();
    }
    pc.addEventListener("icegatheringstatechange", check);
  });
}

/** A CallError from a non-201 reply, using the OpenAI-shaped JSON error body when present. */
async function errorFrom(reply) {
  let code = `http_${reply.status}`;
  let message = `${reply.status} ${reply.statusText}`;
  try {
    const body = await reply.json();
    if (body && body.error) {
      code = body.error.code || code;
      message = body.error.message || message;
    }
  } catch {
    // not JSON: keep the status line
  }
  const retryAfter = Number.parseFloat(reply.headers.get("Retry-After"));
  return new CallError(message, code, reply.status, Number.isFinite(retryAfter) ? retryAfter : null);
}
