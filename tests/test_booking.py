"""The booking env (tests/booking.py), a third-party env in call syntax: its tasks, its
demonstration, its errors and its partial credit."""

from __future__ import annotations

from tests.booking import Booking, NarrowedBooking, catalogue


def test_tasks_are_deterministic_and_the_splits_disjoint():
    train, test = Booking().tasks("train", 120), Booking().tasks("test", 120)
    assert [t.to_dict() for t in train] == [t.to_dict() for t in Booking().tasks("train", 120)]
    assert len({t.instruction for t in train}) == 120
    assert not {t.instruction for t in train} & {t.instruction for t in test}
    assert {t.split for t in train} == {"train"} and {t.split for t in test} == {"test"}
    assert Booking(seed=1).tasks("train", 5) != Booking().tasks("train", 5)
    for task in train[:20]:  # every task can be solved by some restaurant it names
        assert task.data["answers"]
        assert all(catalogue()[rid]["cuisine"] == task.data["cuisine"] for rid in task.data["answers"])


def test_the_demonstration_books_the_right_table():
    env = Booking()
    task, actions = env.demo_episode()
    assert actions == ['find(cuisine="thai", area="north")', 'open(id="R012")',
                       'book(id="R012", day="friday", time="19:00", people=2)']
    assert task.split == "train" and task in env.tasks("train", int(task.id.split("-")[-1]) + 1)
    env.reset(task)
    results = [env.act(a)[1] for a in actions]
    assert "R012" in results[0].observation and "friday" in results[1].observation
    assert results[-1].done and results[-1].reward == 1.0
    assert not any(r.invalid for r in results)
    assert env.achieved_task().instruction == task.instruction


def test_a_bad_id_or_slot_is_an_invalid_step_that_says_why():
    env = Booking()
    env.reset(env.demo_episode()[0])
    _, result = env.act('open(id="R999")')
    assert result.invalid and not result.done and "no restaurant 'R999'" in result.observation
    _, result = env.act('book(id="R012", day="monday", time="19:00", people=2)')
    assert result.invalid and "R012 takes no bookings on monday" in result.observation
    _, result = env.act('find(cuisine="klingon", area="north")')
    assert result.invalid and "cuisines: thai" in result.observation
    assert env.num_steps == 3


def test_a_partly_right_booking_gets_partial_credit():
    env = Booking()
    task = env.demo_episode()[0]
    env.reset(task)  # right restaurant, right day, wrong time (R012 also takes 20:00)
    _, result = env.act('book(id="R012", day="friday", time="20:00", people=2)')
    assert result.done and not result.invalid and result.reward == 0.75
    env.reset(task)  # wrong time and party size
    assert env.act('book(id="R012", day="friday", time="20:00", people=3)')[1].reward == 0.5
    other = next(rid for rid, r in catalogue().items() if r["cuisine"] != "thai"
                 and "friday" in r["days"] and "19:00" in r["times"])
    env.reset(task)  # a wrong restaurant earns nothing, even at the right slot
    _, result = env.act(f'book(id="{other}", day="friday", time="19:00", people=2)')
    assert result.done and not result.invalid and result.reward == 0.0
    env.reset(task)
    assert env.act("done()")[1].reward == 0.0 and env.achieved_task() is None


def test_the_narrowed_variant_offers_what_the_state_shows():
    env = NarrowedBooking()
    env.reset(env.demo_episode()[0])

    def enums():
        return {t["function"]["name"]: {k: v.get("enum") for k, v in
                                        t["function"]["parameters"]["properties"].items()}
                for t in env.action_tools()}

    assert list(enums()) == ["find", "done"] and enums()["find"]["area"][0] == "north"
    env.act('find(cuisine="thai", area="north")')
    assert enums()["open"]["id"] == env.state["shown"] and "book" not in enums()
    env.act('open(id="R012")')
    book = enums()["book"]
    assert book["id"] == ["R012"] and "friday" in book["day"] and "19:00" in book["time"]
    assert book["people"] is None  # a number stays a number
