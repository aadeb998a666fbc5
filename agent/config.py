"""Server settings: one pydantic model, filled from defaults, the CLI and the environment."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, Field

REPO_ROOT = Path(__file__).resolve().parent.parent


class VadSettings(BaseModel):
    """Turn detection on the caller's audio (webrtcvad)."""

    aggressiveness: int = Field(2, ge=0, le=3)
    onset_ms: int = Field(60, ge=20, description="speech must persist this long to start a turn")
    silence_ms: int = Field(500, ge=100, description="silence that ends an utterance")
    preroll_ms: int = Field(300, ge=0, description="audio kept from before the onset")
    max_utterance_ms: int = Field(30_000, ge=1_000, description="an utterance is cut here")


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


class Settings(BaseModel):
    """Everything `omnivox serve` can be told."""

    host: str = "127.0.0.1"
    port: int = 8000
    profile: str = "local"
    data_dir: Path = REPO_ROOT / "data"
    models_dir: Path = REPO_ROOT / "models"
    web_dir: Path = REPO_ROOT / "web"
    # No public STUN server unless asked for: calls on loopback and LANs need none.
    ice_servers: list[str] = Field(default_factory=list)
    max_calls: int = Field(16, ge=1)
    max_sdp_bytes: int = 64 * 1024
    max_event_bytes: int = Field(64 * 1024, description="largest data-channel message accepted")
    outbound_queue_ms: int = Field(
        30_000, ge=200, description="agent audio buffered ahead of playback"
    )
    vad: VadSettings = Field(default_factory=VadSettings)
    conversation: ConversationSettings = Field(default_factory=ConversationSettings)
