"""Server settings, declared once: each field is a setting, its `OMNIVOX_*` environment variable
and its `omnivox serve --flag` (pydantic-settings; the command line wins over the environment)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from media.vad import VadConfig
from pipeline import environment

REPO_ROOT = Path(__file__).resolve().parent.parent


DEFAULT_INSTRUCTIONS = (
    "You are a helpful voice assistant on a phone call. Answer in one or two short spoken "
    "sentences. No lists, no markdown, no emoji. Write numbers as words."
)


class ConversationSettings(BaseModel):
    """How a call's conversation runs (per server; session.update can change some per call)."""

    instructions: str = DEFAULT_INSTRUCTIONS
    voice: str = "default"
    max_reply_tokens: int = Field(64, ge=1, le=4096)
    max_history_items: int = Field(32, ge=2)
    barge_in: bool = Field(True, description="caller speech cancels the agent's reply")
    barge_in_min_ms: int = Field(200, ge=0, description="speech shorter than this never cancels")
    echo_guard_ms: int = Field(0, ge=0, description="ignore onsets this long after agent starts")
    create_response: bool = Field(True, description="answer each utterance automatically")
    server_vad: bool = Field(True, description="the VAD ends turns; off: the client commits them")
    eagerness: Literal["low", "medium", "high", "auto"] | None = Field(
        None, description="semantic_vad's eagerness: the Thinker judges at each pause whether "
                          "the caller's words end the turn "
                          "(agent/realtime/turn_taking/semantic_turns.py); "
                          "None: server_vad, the silence alone")
    text_only: bool = Field(False, description="replies in text alone (output_modalities text)")
    # Per call, never a server setting: a WebSocket call's audio in its events, in the format its
    # session chose (session.audio.*.format; the call starts them at audio/pcm). None on a call
    # whose audio is media (WebRTC: Opus on the track), where no format applies.
    input_format: Literal["audio/pcm", "audio/pcmu", "audio/pcma"] | None = Field(
        None, description="a WebSocket call's audio appended (session.audio.input.format)")
    output_format: Literal["audio/pcm", "audio/pcmu", "audio/pcma"] | None = Field(
        None, description="a WebSocket call's audio deltas (session.audio.output.format)")
    transcription_only: bool = Field(
        False, description="a transcription session (session.type transcription): the caller's "
                           "speech is written down, never answered")
    truncation: Literal["auto", "disabled"] | float = Field(
        "auto", description="a history too long for the Thinker's window: auto (the oldest "
                            "turns go, in steps), disabled (the turn fails), or the share kept")
    idle_timeout_ms: int | None = Field(
        None, ge=1000, description="server_vad: answer anyway after this much silence from the "
                                   "caller once the agent's last reply played out")
    # Per call, as its session asks (session.audio.input.noise_reduction); off unless asked.
    noise_reduction: Literal["near_field", "far_field"] | None = Field(
        None, description="the caller's audio denoised (RNNoise, media/noise_reduction.py) "
                          "before the VAD and the model hear it; both types run the same")


OPENAI_VOICES = ("alloy", "ash", "ballad", "coral", "echo", "sage", "shimmer", "verse", "marin",
                 "cedar")


class AliasSettings(BaseModel):
    """OpenAI's names, as agent frameworks send them by default, onto what this server serves
    (agent/realtime/aliases.py). A profile may lay its own over these (profiles.toml,
    `[NAME.aliases]`); an empty table refuses those names as any unknown name is refused."""

    models: list[str] = Field(
        default_factory=lambda: ["gpt-realtime*", "gpt-4o-realtime*", "gpt-4o-mini-realtime*"],
        description="Realtime model names (shell patterns) that mean the call's own model")
    voices: dict[str, str] = Field(
        default_factory=lambda: dict.fromkeys(OPENAI_VOICES, ""),
        description="voice name -> the family's voice ('': the server's voice)")
    transcription_models: list[str] = Field(
        default_factory=lambda: ["whisper-1", "gpt-*transcribe*", "gpt-realtime-whisper*"],
        description="transcription model names (shell patterns) that mean the model's own "
                    "recogniser")


def default_call_workers(cores: int | None = None) -> int:
    """How many call-worker processes a server runs unless told: 1 below 8 cores (the front,
    the engines and one worker already share them), else one per 4 cores, at most 8."""
    cores = cores or len(os.sched_getaffinity(0))
    return 1 if cores < 8 else min(8, cores // 4)


ENV_PREFIX = "OMNIVOX_"
ENV_NESTED = "__"  # OMNIVOX_VAD__SILENCE_MS is vad.silence_ms


def env_name(*path: str) -> str:
    """The environment variable of the setting at `path` (field names, outermost first)."""
    return ENV_PREFIX + ENV_NESTED.join(part.upper() for part in path)


# Lists given in the environment (or on the command line) as one comma-separated string.
CommaList = Annotated[list[str], NoDecode]


class Settings(BaseSettings):
    """Everything `omnivox serve` can be told."""

    # A refused value is named in the error, never echoed: it may be an API key.
    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX, env_nested_delimiter=ENV_NESTED, env_ignore_empty=True,
        hide_input_in_errors=True,
    )

    host: str = Field("127.0.0.1", description="address to listen on")
    port: int = Field(8000, ge=1, le=65535, description="port to listen on")
    profile: str = Field("local", description="model profile (agent/profiles.toml)")
    log_level: Literal["critical", "error", "warning", "info", "debug"] = Field(
        "info", description="lowest level logged"
    )
    log_format: Literal["text", "json"] = Field(
        "text", description="log records as text lines or one JSON object per line"
    )
    data_dir: Path = Field(
        REPO_ROOT / "data",
        description="call records (records.sqlite3, agent/ops/records.py); created if missing",
    )
    models_dir: Path = Field(
        REPO_ROOT / "models", description="model directories, built on first use"
    )
    # One version of the profile's model is served at a time. Version 1 unless chosen: building
    # a new version (`omnivox models build NAME --version N`) never changes what a server serves.
    model_version: str = Field(
        "1", pattern=r"^[1-9][0-9]*$",
        description="the version of the profile's model served (NAME@VERSION)",
    )
    # Real weights are read where they lie (never copied): the `omni` and `orpheus` profiles
    # need a directory; the profiles that build their own models refuse one.
    model_path: Path | None = Field(
        None, description="a real checkpoint directory, for the profiles that serve one "
        "(omni, orpheus)",
    )
    # A profile with GPU settings (`omni`, `orpheus`) takes them where a GPU answers; on a host
    # without one it refuses to start unless told to run on the CPU (a rehearsal: slow).
    device: Literal["auto", "cuda", "cpu"] = Field(
        "auto", description="where a profile with GPU settings runs: auto (the GPU where "
        "nvidia-smi finds one, else refused), cuda, or cpu",
    )
    web_dir: Path = REPO_ROOT / "web"
    # No public STUN server unless asked for: calls on loopback and LANs need none.
    ice_servers: CommaList = Field(
        default_factory=list, description="ICE server URLs (stun:/turn:), comma-separated"
    )
    max_calls: int = Field(16, ge=1, description="concurrent calls taken before 503")
    # Call workers (agent/calls/workers.py): 1 serves every call in this process; N > 1 runs N
    # processes that each hold their calls' media, all on the one pipeline.
    call_workers: int = Field(
        default_factory=default_call_workers, ge=1, le=64,
        description="processes holding the calls' media (1 below 8 cores, else cores//4, "
        "at most 8); each takes up to max_calls",
    )
    max_sdp_bytes: int = Field(64 * 1024, ge=1024, description="largest SDP offer accepted")
    max_event_bytes: int = Field(64 * 1024, description="largest data-channel message accepted")
    # Per-call limits (agent/calls/call.py); a call that reaches one gets an `error` event naming it
    # and is hung up.
    max_events_per_s: float = Field(
        50.0, gt=0, description="data-channel messages a call may send per second, sustained"
    )
    max_event_burst: int = Field(
        100, ge=1, description="messages a call may send at once before the rate applies"
    )
    max_call_s: float = Field(3600.0, gt=0, description="a call is ended after this long")
    idle_timeout_s: float = Field(
        300.0, gt=0, description="a call with no caller speech, message or agent audio ends"
    )
    resume_grace_s: float = Field(
        30.0, ge=0, le=3600, description="a WebRTC call whose connection drops may be resumed "
        "this long with the token in its session.created (header Omnivox-Resume-Token on a "
        "new call), keeping its conversation; 0: off",
    )
    outbound_queue_ms: int = Field(
        30_000, ge=200, description="agent audio buffered ahead of playback"
    )
    inbound_jitter_packets: int = Field(
        1, ge=1, le=16, description="caller audio packets held to reorder them (20 ms each)"
    )
    # Realtime over WebSocket (agent/calls/websocket_call.py): what one socket may hold.
    ws_max_message_bytes: int = Field(
        2 * 1024 * 1024, ge=1024, description="largest WebSocket client message (an audio append)"
    )
    ws_audio_ahead_ms: int = Field(
        30_000, ge=1000, description="caller audio a WebSocket client may send ahead of real "
        "time; past it the client gets an error and is disconnected",
    )
    ws_send_buffer_bytes: int = Field(
        8 * 1024 * 1024, ge=64 * 1024, description="server events waiting for a WebSocket "
        "client to read them; past it the client gets an error and is disconnected",
    )
    vad: VadConfig = Field(default_factory=VadConfig)
    conversation: ConversationSettings = Field(default_factory=ConversationSettings)
    aliases: AliasSettings = Field(default_factory=AliasSettings)
    # Authentication (agent/api/auth.py). No API keys: local mode, every endpoint open. SecretStr
    # keeps the keys out of reprs and logs.
    api_keys: Annotated[list[SecretStr], NoDecode] = Field(
        default_factory=list, description="Bearer keys for /v1, comma-separated"
    )
    client_secret_ttl_s: int = Field(
        60, ge=1, le=3600, description="client secret lifetime: the default and the longest"
    )
    max_client_secrets: int = Field(1024, ge=1, description="client secrets outstanding at once")
    cors_origins: CommaList = Field(
        default_factory=list, description="origins allowed cross-origin, comma-separated"
    )
    # Deployment past one host (docs/operations.md, Deployment): a call lives in one server
    # process, so its later requests must reach that process. Behind a router with one path per
    # server (/pods/<name>/...), the Location of a call names that path; requests arrive with
    # or without it (the router strips it).
    location_prefix: str = Field(
        "", pattern=r"^(/[A-Za-z0-9._~-]+)*$",
        description="path before a call's path in its Location, e.g. /pods/omnivox-0",
    )
    # Admission control (agent/calls/admission.py): measured load, not only max_calls.
    admission_max_loop_lag_ms: float = Field(
        100.0, ge=0, description="refuse new calls (503 server_busy) while the event loop woke "
        "this late within the admission window; 0: off",
    )
    admission_max_cpu_wait: float = Field(
        0.5, ge=0, le=1, description="refuse new calls while the call plane's thread waited "
        "for a CPU this share of the admission window; 0: off",
    )
    admission_max_pacing_late_ms: float = Field(
        50.0, ge=0, description="refuse new calls while more than 1% of the calls' outbound "
        "20 ms frames left this much later than their clock within the admission window "
        "(p99 of the pacer's lateness); 0: off",
    )
    admission_window_s: float = Field(
        5.0, gt=0, le=60, description="how far back admission control looks at the load"
    )
    admission_max_starting: int = Field(
        8, ge=0, description="calls taken within the admission window, before their load "
        "shows in its figures; one more waits (503 server_busy); 0: off",
    )
    max_completions_in_flight: int = Field(
        4, ge=1, description="chat completion requests in flight per engine (they share it "
        "with the calls' turns); one more gets 429 with Retry-After",
    )
    drain_timeout_s: float = Field(
        30.0, ge=0, description="on SIGTERM, how long live calls may go on before they are closed"
    )

    @field_validator("log_level", "log_format", mode="before")
    @classmethod
    def _lower_case(cls, value: object) -> object:
        return value.strip().lower() if isinstance(value, str) else value

    @field_validator("api_keys", "cors_origins", "ice_servers", mode="before")
    @classmethod
    def _split_commas(cls, value: object) -> object:
        """Environment variables and config files may give these as one comma-separated string."""
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value

    @field_validator("api_keys")
    @classmethod
    def _check_keys(cls, keys: list[SecretStr]) -> list[SecretStr]:
        for key in keys:
            value = key.get_secret_value()
            if len(value) < 16 or any(c.isspace() or c == "," for c in value):
                raise ValueError("API keys need at least 16 characters, no spaces or commas")
        return keys

    @field_validator("cors_origins")
    @classmethod
    def _check_origins(cls, origins: list[str]) -> list[str]:
        for origin in origins:
            scheme, sep, rest = origin.partition("://")
            if origin != "*" and (scheme not in ("http", "https") or not sep or not rest
                                  or "/" in rest):
                raise ValueError(f"CORS origin {origin!r} is not '*' or scheme://host[:port]")
        return origins


def add_setting_flags(parser: argparse.ArgumentParser, names: tuple[str, ...]) -> None:
    """One command-line flag per setting in `names` (--max-calls for max_calls), its help and
    default read from the setting's declaration above."""
    for name in names:
        field = Settings.model_fields[name]
        default = field.get_default(call_default_factory=True)
        shown = default.relative_to(REPO_ROOT) if isinstance(default, Path) else default
        parser.add_argument(
            "--" + name.replace("_", "-"), default=None, metavar=name.split("_")[-1].upper(),
            help=f"{field.description} (default: {shown}; environment: {env_name(name)})")


def add_api_key_option(parser: argparse.ArgumentParser) -> None:
    """`--api-key` of a command-line client (bench calls, rollout, sip), defaulting to
    OMNIVOX_API_KEY."""
    parser.add_argument("--api-key", default=environment.get("OMNIVOX_API_KEY"),
                        help="Bearer key for a server with API keys (or OMNIVOX_API_KEY)")
