"""Wordle as a TRL environment, shaped like the `WordleEnv` of TRL's OpenEnv guide (one `guess`
tool, an exception once the game is over, the reward kept on the instance for a reward function
to read), with the game played locally and the secret word taken from the dataset row, so that
the same task and guesses always give the same feedback."""

MAX_GUESSES = 6


def feedback(guess: str, secret: str) -> str:
    """G: right letter, right place; Y: in the word elsewhere; X: not in the word."""
    marks = ["G" if g == s else "X" for g, s in zip(guess, secret)]
    left = [s for g, s in zip(guess, secret) if g != s]
    for i, g in enumerate(guess):
        if marks[i] == "X" and g in left:
            marks[i] = "Y"
            left.remove(g)
    return " ".join(marks)


class WordleEnv:
    def reset(self, **kwargs) -> str | None:
        self.secret = kwargs["secret"]
        self.guesses = []
        self.reward = 0.0
        self.done = False
        return f"You have {MAX_GUESSES} guesses."

    def guess(self, guess: str) -> str:
        """
        Make a guess in the Wordle game.

        Args:
            guess: The guessed word, five letters, e.g. 'crane'

        Returns:
            The feedback, one mark per letter: G (right place), Y (elsewhere), X (not in the word).
        """
        if self.done:
            raise ValueError("Game over.")
        word = guess.strip().strip("[]").lower()
        if len(word) != 5 or not word.isalpha():
            raise ValueError(f"{guess[:20]!r} is not a five-letter word.")
        self.guesses.append(word)
        marks = feedback(word, self.secret)
        # partial credit for green letters, as TRL's Wordle example rewards them
        self.reward = 1.0 if word == self.secret else marks.count("G") / 10
        self.done = word == self.secret or len(self.guesses) == MAX_GUESSES
        ending = " You won!" if word == self.secret else (" Game over." if self.done else "")
        return f"{' '.join(word.upper())}\n{marks}{ending}"


def reward_func(environments, **kwargs) -> list[float]:
    return [env.reward for env in environments]
