"""Book a restaurant table: a third-party env written only against the documented Env
contract (docs/environments.md, "Bring your own environment"), as a user would write one.

Four tools with JSON-schema arguments and a demonstration in call syntax, the shape issue 20
measures constrained decoding on: `find(cuisine, area)`, `open(id)`,
`book(id, day, time, people)`, `done()`. Load it as `tests.booking:Booking`.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import random

from offline_agent.envs.base import ActionError, Env, StepResult
from offline_agent.types import Task, ToolCall

CUISINES = ["thai", "italian", "indian", "french", "chinese", "mexican", "greek", "japanese"]
AREAS = ["north", "south", "east", "west"]
DAYS = ["monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday"]
TIMES = ["18:00", "18:30", "19:00", "19:30", "20:00", "20:30", "21:00"]
MAX_PEOPLE = 8
PER_COMBO = 3  # restaurants per (cuisine, area): 96 in all
ADJECTIVES = ["Golden", "Blue", "Red", "Little", "Old", "Green", "Silver", "Happy", "Royal",
              "Quiet", "Lucky", "Wild"]
NOUNS = ["Lotus", "Door", "Lantern", "Garden", "Table", "Spoon", "Oak", "Harbour"]
DEMO = {"cuisine": "thai", "area": "north", "day": "friday", "time": "19:00", "people": 2}
DEMO_ID = "R012"


def _string(description: str) -> dict:
    return {"type": "string", "description": description}


def _tool(name: str, description: str, properties: dict) -> dict:
    return {"type": "function", "function": {
        "name": name, "description": description, "parameters": {
            "type": "object", "properties": properties, "required": list(properties)}}}


TOOLS = [
    _tool("find", "List the restaurants of a cuisine in an area, with their ids.",
          {"cuisine": _string(f"one of {', '.join(CUISINES)}"),
           "area": _string(f"one of {', '.join(AREAS)}")}),
    _tool("open", "Show the days and times a restaurant takes bookings.",
          {"id": _string("a restaurant id, e.g. R012")}),
    _tool("book", "Book a table; ends the episode.",
          {"id": _string("a restaurant id, e.g. R012"),
           "day": _string("a weekday, e.g. friday"),
           "time": _string("HH:MM, e.g. 19:00"),
           "people": {"type": "integer", "description": f"1 to {MAX_PEOPLE}"}}),
    _tool("done", "Give up without booking; ends the episode.", {}),
]


@functools.cache
def catalogue() -> dict[str, dict]:
    """96 restaurants, fixed for every seed (shared read-only data, not episode state).
    R012 is a thai restaurant in the north that takes friday 19:00: the demonstration's."""
    rng = random.Random("booking-catalogue")
    combos = [c for c in itertools.product(CUISINES, AREAS) for _ in range(PER_COMBO)]
    rng.shuffle(combos)
    demo_at = int(DEMO_ID[1:]) - 1
    swap = combos.index((DEMO["cuisine"], DEMO["area"]))
    combos[demo_at], combos[swap] = combos[swap], combos[demo_at]
    names = [f"{a} {n}" for a in ADJECTIVES for n in NOUNS]
    rng.shuffle(names)
    out = {}
    for i, (cuisine, area) in enumerate(combos):
        days = set(rng.sample(DAYS, rng.randint(3, 5)))
        times = set(rng.sample(TIMES, rng.randint(3, 4)))
        if i == demo_at:
            days.add(DEMO["day"])
            times.add(DEMO["time"])
        out[f"R{i + 1:03d}"] = {"name": names[i], "cuisine": cuisine, "area": area,
                                "days": [d for d in DAYS if d in days],
                                "times": [t for t in TIMES if t in times]}
    return out


def fits(goal: dict, rid: str) -> bool:
    """Whether restaurant `rid` can take the booking `goal` asks for."""
    r = catalogue()[rid]
    return (r["cuisine"], r["area"]) == (goal["cuisine"], goal["area"]) \
        and goal["day"] in r["days"] and goal["time"] in r["times"]


def instruction(goal: dict) -> str:
    return (f"Book a table for {goal['people']} at a {goal['cuisine']} restaurant in the "
            f"{goal['area']} on {goal['day']} at {goal['time']}.")


def split_of(goal: dict) -> str:
    """1 goal in 5 is held out, by a hash of its instruction: the splits never share one."""
    digest = int(hashlib.sha256(f"booking:{instruction(goal)}".encode()).hexdigest(), 16)
    return "test" if digest % 5 == 0 else "train"


@functools.cache
def _all_goals() -> tuple[dict, ...]:
    """Every booking some restaurant can take, for 1 to 6 people."""
    slots = {(r["cuisine"], r["area"], d, t) for r in catalogue().values()
             for d in r["days"] for t in r["times"]}
    keys = ("cuisine", "area", "day", "time")
    return tuple({**dict(zip(keys, slot)), "people": p}
                 for slot in sorted(slots) for p in range(1, 7))


@functools.cache
def _goals(seed: int, split: str) -> tuple[dict, ...]:
    goals = [g for g in _all_goals() if split_of(g) == split]
    random.Random(f"booking:{seed}:{split}").shuffle(goals)
    return tuple(goals)


class Booking(Env):
    name = "booking"
    tools = TOOLS

    def __init__(self, max_steps: int = 8, seed: int = 0):
        super().__init__(max_steps=max_steps, seed=seed)

    def tasks(self, split: str, n: int) -> list[Task]:
        if split not in ("train", "test"):
            raise ValueError(f"split must be 'train' or 'test', got {split!r}")
        return [self._task(split, i) for i in range(n)]

    def _task(self, split: str, i: int) -> Task:
        goals = _goals(self.seed, split)
        goal = goals[i % len(goals)]
        answers = [rid for rid in catalogue() if fits(goal, rid)]
        return Task(f"booking-{split}-{i:05d}", self.name, instruction(goal), split,
                    {**goal, "answers": answers})

    def system_prompt(self) -> str:
        return ("You book restaurant tables. Write one action per reply:\n"
                'find(cuisine="thai", area="north") - restaurants and their ids\n'
                'open(id="R012") - the days and times it takes bookings\n'
                'book(id="R012", day="friday", time="19:00", people=2) - book; ends the episode\n'
                "done() - give up\n"
                f"Cuisines: {', '.join(CUISINES)}. Areas: {', '.join(AREAS)}.")

    def _reset(self, task: Task) -> str:
        self.state = {"shown": [], "opened": None, "booking": None, "finished": False}
        return "No restaurant found yet."

    def _execute(self, call: ToolCall) -> StepResult:
        if self.state["finished"]:
            raise ActionError("the episode is over")
        args = {k: v.strip().lower() if isinstance(v, str) else v
                for k, v in call.arguments.items()}
        if call.name == "find":
            return self._find(_pick(args["cuisine"], CUISINES, "cuisine"),
                              _pick(args["area"], AREAS, "area"))
        if call.name == "open":
            return self._open(_restaurant(args["id"]))
        if call.name == "book":
            return self._book(_restaurant(args["id"]), args["day"], args["time"], args["people"])
        self.state = {**self.state, "finished": True}
        return StepResult("Done without a booking.", reward=0.0, done=True)

    def _find(self, cuisine: str, area: str) -> StepResult:
        ids = [rid for rid, r in catalogue().items() if (r["cuisine"], r["area"]) == (cuisine, area)]
        self.state = {**self.state, "shown": ids}
        lines = [f"{rid} {catalogue()[rid]['name']}" for rid in ids]
        return StepResult(f"{cuisine.title()} restaurants in the {area}:\n" + "\n".join(lines))

    def _open(self, rid: str) -> StepResult:
        r = catalogue()[rid]
        self.state = {**self.state, "opened": rid}
        return StepResult(f"{rid} {r['name']} ({r['cuisine']}, {r['area']}). Takes bookings on "
                          f"{', '.join(r['days'])} at {', '.join(r['times'])}.")

    def _book(self, rid: str, day: str, time: str, people: int) -> StepResult:
        r = catalogue()[rid]
        if _pick(day, DAYS, "day") not in r["days"]:
            raise ActionError(f"{rid} takes no bookings on {day}; days: {', '.join(r['days'])}")
        if time not in r["times"]:
            raise ActionError(f"{rid} takes no bookings at {time[:10]!r}; times: "
                              f"{', '.join(r['times'])}")
        if not 1 <= people <= MAX_PEOPLE:
            raise ActionError(f"people must be 1 to {MAX_PEOPLE}")
        booking = {"id": rid, "day": day, "time": time, "people": people}
        self.state = {**self.state, "booking": booking, "finished": True}
        parts = score(self.task.data, booking)
        return StepResult(f"Booked {rid} {r['name']} for {people} on {day} at {time}.",
                          reward=reward(parts), done=True,
                          info={"parts": parts})

    def available_actions(self) -> list[str]:
        """Open a listed restaurant; once one is open, book one of its slots for the
        party size the task names."""
        if self.state["finished"]:
            return []
        opened = self.state["opened"]
        actions = [f'open(id="{rid}")' for rid in self.state["shown"] if rid != opened]
        if opened:
            r, people = catalogue()[opened], self.task.data["people"]
            actions += [f'book(id="{opened}", day="{d}", time="{t}", people={people})'
                        for d in r["days"] for t in r["times"]]
        return actions

    def achieved_task(self) -> Task | None:
        booking = self.state["booking"] if self.state else None
        if booking is None:
            return None
        r = catalogue()[booking["id"]]
        goal = {"cuisine": r["cuisine"], "area": r["area"], "day": booking["day"],
                "time": booking["time"], "people": booking["people"]}
        return Task(f"{self.task.id}-achieved", self.name, instruction(goal), self.task.split,
                    {**goal, "answers": [rid for rid in catalogue() if fits(goal, rid)]})

    def demo_episode(self) -> tuple[Task, list[str]]:
        goals = _goals(self.seed, "train")
        task = self._task("train", goals.index(DEMO))
        return task, ['find(cuisine="thai", area="north")', 'open(id="R012")',
                      'book(id="R012", day="friday", time="19:00", people=2)']


def score(goal: dict, booking: dict) -> dict[str, float]:
    """Which parts of the booking match the task, 1 each. The reward is their mean where the
    restaurant is right (cuisine and area; wrong time: 0.75) and 0 where it is not, so a
    guessed id earns nothing however right its day, time and party size."""
    r = catalogue()[booking["id"]]
    return {"restaurant": float((r["cuisine"], r["area"]) == (goal["cuisine"], goal["area"])),
            "day": float(booking["day"] == goal["day"]),
            "time": float(booking["time"] == goal["time"]),
            "people": float(booking["people"] == goal["people"])}


def reward(parts: dict[str, float]) -> float:
    return sum(parts.values()) / len(parts) if parts["restaurant"] else 0.0


def _pick(value: str, allowed: list[str], what: str) -> str:
    if value not in allowed:
        raise ActionError(f"no {what} {value[:20]!r}; {what}s: {', '.join(allowed)}")
    return value


def _restaurant(rid: str) -> str:
    rid = rid.upper()
    if rid not in catalogue():
        raise ActionError(f"no restaurant {rid[:20]!r}; find lists the ids of a cuisine and area")
    return rid


class NarrowedBooking(Booking):
    """Booking whose tools narrow each argument to what the state offers (`action_tools`, the
    plugin guide's per-state enums): cuisines and areas always; `open` the ids `find` showed;
    `book` the open restaurant's id, days and times. The longest call then needs 60 tokens
    under the grammar's budget check, so the budget is 64."""

    name = "booking_narrowed"
    max_action_tokens = 64

    def action_tools(self) -> list[dict]:
        find, open_, book, done = (t["function"] for t in TOOLS)
        tools = [_narrowed(find, cuisine=CUISINES, area=AREAS)]
        if self.state["shown"]:
            tools.append(_narrowed(open_, id=self.state["shown"]))
        if opened := self.state["opened"]:
            r = catalogue()[opened]
            tools.append(_narrowed(book, id=[opened], day=r["days"], time=r["times"]))
        return tools + [TOOLS[3]]


def _narrowed(spec: dict, **enums: list[str]) -> dict:
    props = {k: {**v, "enum": list(enums[k])} if k in enums else v
             for k, v in spec["parameters"]["properties"].items()}
    return {"type": "function",
            "function": {**spec, "parameters": {**spec["parameters"], "properties": props}}}
