"""The answer-quality question set of `omnivox bench answers`: simple facts, small talk and
follow-ups that need the previous turn, each with the keywords a right answer holds.

Numbers are accepted as digits or words (the local Thinker is told to write them as words). A
follow-up carries the turns before it as fixed text, so that it is scored on its own.
"""

from __future__ import annotations

from dataclasses import dataclass

YES = ("yes", "yeah", "yep", "of course", "certainly", "indeed")
NO = ("no", "not", "cannot", "can't", "don't", "doesn't", "isn't", "never")
GREETING = ("hello", "hi", "hey", "greetings", "welcome", "good morning", "good day")
THANKS = ("welcome", "pleasure", "glad", "no problem", "anytime", "happy to help")
FAREWELL = ("goodbye", "bye", "take care", "see you", "have a", "farewell", "later")
WELL = ("good", "well", "fine", "great", "doing", "wonderful", "happy")


@dataclass(frozen=True)
class Question:
    """One item: `question` asked after `before` (user, assistant, ... turns), right when the
    answer holds one of `any_of` (if given), all of `all_of` and none of `none_of`."""

    category: str
    question: str
    any_of: tuple[str, ...] = ()
    all_of: tuple[str, ...] = ()
    none_of: tuple[str, ...] = ()
    before: tuple[str, ...] = ()

    def messages(self) -> list[dict[str, str]]:
        """The conversation up to (not including) the question, as chat messages."""
        roles = ("user", "assistant")
        return [{"role": roles[i % 2], "content": text} for i, text in enumerate(self.before)]


def _fact(category: str, question: str, *any_of: str) -> Question:
    return Question(category, question, any_of=any_of)


def _yes(question: str) -> Question:
    return Question("yes/no", question, any_of=YES, none_of=("no",))


def _no(question: str) -> Question:
    return Question("yes/no", question, any_of=NO, none_of=("yes",))


def _follow(user: str, agent: str, question: str, *any_of: str) -> Question:
    return Question("follow-up", question, any_of=any_of, before=(user, agent))


QUESTIONS: tuple[Question, ...] = (
    _fact("capital", "What is the capital of France?", "paris"),
    _fact("capital", "What is the capital of Japan?", "tokyo"),
    _fact("capital", "What is the capital of Italy?", "rome"),
    _fact("capital", "What is the capital of Germany?", "berlin"),
    _fact("capital", "What is the capital of Spain?", "madrid"),
    _fact("capital", "What is the capital of England?", "london"),
    _fact("arithmetic", "What is two plus two?", "four", "4"),
    _fact("arithmetic", "What is three plus five?", "eight", "8"),
    _fact("arithmetic", "What is ten minus four?", "six", "6"),
    _fact("arithmetic", "What is five times two?", "ten", "10"),
    _fact("arithmetic", "What is one plus one?", "two", "2"),
    _fact("arithmetic", "What is half of ten?", "five", "5"),
    _fact("calendar", "What day comes after Monday?", "tuesday"),
    _fact("calendar", "What day comes after Friday?", "saturday"),
    _fact("calendar", "What month comes after January?", "february"),
    _fact("calendar", "How many days are there in a week?", "seven", "7"),
    _fact("calendar", "How many months are there in a year?", "twelve", "12"),
    _fact("calendar", "What is the last month of the year?", "december"),
    _fact("colour", "What colour is the sky on a clear day?", "blue"),
    _fact("colour", "What colour is grass?", "green"),
    _fact("colour", "What colour is snow?", "white"),
    _fact("colour", "What colour is a ripe banana?", "yellow"),
    _fact("time of day", "When does the sun rise, in the morning or in the evening?", "morning"),
    _fact("time of day", "When do people usually eat breakfast?", "morning"),
    _fact("animal", "Which animal says moo?", "cow"),
    _fact("animal", "Which animal barks?", "dog"),
    _fact("animal", "How many legs does a spider have?", "eight", "8"),
    _fact("animal", "Which animal says meow?", "cat"),
    _fact("animal", "How many legs does a dog have?", "four", "4"),
    _fact("animal", "Which animal is called the king of the jungle?", "lion"),
    Question("greeting", "Hello!", any_of=GREETING),
    Question("greeting", "Good morning!", any_of=GREETING),
    Question("greeting", "How are you today?", any_of=WELL),
    Question("thanks", "Thank you very much.", any_of=THANKS),
    Question("thanks", "Thanks for your help.", any_of=THANKS),
    Question("thanks", "Goodbye!", any_of=FAREWELL),
    _yes("Is the sun hot?"),
    _yes("Is ice cold?"),
    _yes("Is the sea salty?"),
    _no("Can a dog fly?"),
    _no("Is fire cold?"),
    _no("Is the moon made of cheese?"),
    _follow("What is the capital of France?", "The capital of France is Paris.",
            "What about Italy?", "rome"),
    _follow("What is the capital of Japan?", "The capital of Japan is Tokyo.",
            "And of Germany?", "berlin"),
    _follow("What is two plus two?", "Two plus two is four.",
            "And what is that times two?", "eight", "8"),
    _follow("What day comes after Monday?", "Tuesday comes after Monday.",
            "And the day after that?", "wednesday"),
    _follow("My name is Anna.", "Nice to meet you, Anna!", "What is my name?", "anna"),
    _follow("I have a dog called Max.", "Max is a lovely name for a dog!",
            "What is my dog called?", "max"),
    _follow("I live in Paris.", "Paris is a beautiful city!",
            "Which country do I live in?", "france"),
    _follow("Which animal says moo?", "A cow says moo.",
            "How many legs does it have?", "four", "4"),
)
