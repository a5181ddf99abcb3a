"""Bring a counter to a target: the environment of TRL's `environment_factory` guide, with
the target read from the dataset row (reset's keyword arguments) instead of drawn at random,
so that the same task and calls always give the same episode."""


class CounterEnv:
    def reset(self, **kwargs) -> str | None:
        self.counter = 0
        self.target = kwargs["target"]
        return "The counter is at 0."

    def get_reward(self) -> float:
        return float(self.counter == self.target)

    def increment(self, step: int) -> int:
        """
        Increment the counter.

        Args:
            step: Value to add to the counter, from 1 to 3.

        Returns:
            The updated counter value.
        """
        if not 1 <= step <= 3:
            raise ValueError("step must be from 1 to 3")
        self.counter += step
        return self.counter

    def decrement(self, step: int) -> int:
        """
        Decrement the counter.

        Args:
            step: Value to take from the counter, from 1 to 3.

        Returns:
            The updated counter value.
        """
        if not 1 <= step <= 3:
            raise ValueError("step must be from 1 to 3")
        self.counter -= step
        return self.counter
