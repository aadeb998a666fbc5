"""The Orpheus Talker's prompt: token ids, as the reference builds them.

[start of human] + tokenizer("voice: text") (which begins with Llama 3's <|begin_of_text|>) +
[<|eot_id|>, end of human, start of AI, start of speech]. The ids go to vLLM as they are: a
decoded string would be tokenized again with a second <|begin_of_text|>.
"""

from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer

BEGIN_OF_TEXT = 128000  # Llama 3's <|begin_of_text|>
END_OF_TURN = 128009  # <|eot_id|>
START_OF_SPEECH = 128257
END_OF_SPEECH = 128258  # the Talker stops on it
START_OF_HUMAN = 128259
END_OF_HUMAN = 128260
START_OF_AI = 128261
PROMPT_END = (END_OF_TURN, END_OF_HUMAN, START_OF_AI, START_OF_SPEECH)
DEFAULT_VOICE = "tara"  # the first voice of Orpheus's fine-tuned release


class PromptBuilder:
    """Builds the Talker's prompt ids with the model directory's own tokenizer."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer

    @classmethod
    def load(cls, directory: Path) -> PromptBuilder:
        """The tokenizer.json of a Talker directory."""
        return cls(Tokenizer.from_file(str(directory / "tokenizer.json")))

    def ids(self, voice: str, text: str) -> list[int]:
        """The prompt ids that ask for `text` spoken in `voice`."""
        spoken = self.tokenizer.encode(f"{voice}: {text}").ids  # with <|begin_of_text|>
        return [START_OF_HUMAN, *spoken, *PROMPT_END]
