"""The bank of small function-writing problems behind PythonTasks.

Each problem has a signature, a one-line docstring, a reference solution, hand-picked
visible examples, fixed edge cases and a generator of random arguments; some have
variants (a constant in the statement), which multiplies tasks cheaply. Expected
outputs are computed by running the reference solution here (trusted code).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field

# fmt: off
WORDS = [
    "apple", "banana", "cherry", "dog", "eagle", "fig", "grape", "house", "ice", "jam", "kite",
    "lemon", "moon", "net", "owl", "pear", "queen", "rain", "sun", "tree", "umbrella", "violin",
    "wolf", "yak", "zebra",
]
# fmt: on


@dataclass(frozen=True)
class Problem:
    name: str
    signature: str  # "def f(x: int) -> int:"; the function is named `name`
    doc: str  # may use {fields} of a variant
    solution: str  # the body, indented by 4; may use {fields} of a variant
    visible: tuple[tuple, ...]  # argument tuples shown as examples
    edge: tuple[tuple, ...]  # argument tuples always among the hidden tests
    gen: Callable[[random.Random], tuple]  # one random argument tuple
    variants: tuple[dict, ...] = field(default=({},))

    def source(self, variant: dict) -> str:
        """The reference solution with its docstring, for `variant`."""
        body = self.solution.format(**variant) if variant else self.solution
        return f'{self.signature}\n    """{self.describe(variant)}"""\n{body}\n'

    def describe(self, variant: dict) -> str:
        return self.doc.format(**variant) if variant else self.doc


# ---- argument generators ----------------------------------------------------------------------


def _words(r: random.Random, lo: int = 1, hi: int = 6) -> str:
    return " ".join(r.choice(WORDS) for _ in range(r.randint(lo, hi)))


def _ints(r: random.Random, lo: int = 0, hi: int = 8, a: int = -20, b: int = 50) -> list[int]:
    return [r.randint(a, b) for _ in range(r.randint(lo, hi))]


def _sorted_ints(r: random.Random) -> list[int]:
    return sorted(_ints(r, 0, 6, 0, 30))


def _text(r: random.Random) -> str:
    return "".join(r.choice("abcdeABCDE xyz!,") for _ in range(r.randint(0, 14)))


def _maybe_palindrome(r: random.Random) -> tuple:
    w = "".join(r.choice("abcxyz") for _ in range(r.randint(1, 5)))
    return (w + r.choice(["", "q"]) + w[::-1] if r.random() < 0.6 else w + "ab",)


def _runs(r: random.Random) -> tuple:
    return ("".join(r.choice("abc") * r.randint(1, 4) for _ in range(r.randint(0, 5))),)


def _matrix(r: random.Random) -> tuple:
    rows, cols = r.randint(1, 4), r.randint(1, 4)
    return ([[r.randint(0, 9) for _ in range(cols)] for _ in range(rows)],)


def _anagram_pair(r: random.Random) -> tuple:
    w = "".join(r.choice("abcde") for _ in range(r.randint(1, 6)))
    return (w, "".join(r.sample(w, len(w))) if r.random() < 0.5 else w + "x")


def _clamp_args(r: random.Random) -> tuple:
    lo = r.randint(-10, 20)
    return (_ints(r), lo, lo + r.randint(0, 30))


def _snake(r: random.Random) -> tuple:
    return ("_".join(r.choice(WORDS) for _ in range(r.randint(1, 4))),)


# ---- the bank ---------------------------------------------------------------------------------

PROBLEMS: list[Problem] = [
    Problem(
        "reverse_words",
        "def reverse_words(s: str) -> str:",
        "Return the words of s in reverse order, joined by single spaces.",
        "    return ' '.join(reversed(s.split()))",
        (("hello world",), ("a b c",)),
        (("",), ("single",), ("  spaced   out  ",)),
        lambda r: (_words(r),),
    ),
    Problem(
        "is_palindrome",
        "def is_palindrome(s: str) -> bool:",
        "Return True if s reads the same backwards, ignoring case and non-alphanumeric characters.",
        "    cleaned = [c.lower() for c in s if c.isalnum()]\n    return cleaned == cleaned[::-1]",
        (("Racecar",), ("hello",), ("A man, a plan, a canal: Panama",)),
        (("",), ("ab",), ("No lemon, no melon",)),
        _maybe_palindrome,
    ),
    Problem(
        "fizzbuzz",
        "def fizzbuzz(n: int) -> list:",
        "Return a list of strings for 1..n: '{wa}{wb}' for multiples of both {a} and {b}, "
        "'{wa}' for multiples of {a}, '{wb}' for multiples of {b}, otherwise the number as a string.",
        "    out = []\n    for i in range(1, n + 1):\n"
        "        if i % {a} == 0 and i % {b} == 0:\n            out.append('{wa}{wb}')\n"
        "        elif i % {a} == 0:\n            out.append('{wa}')\n"
        "        elif i % {b} == 0:\n            out.append('{wb}')\n"
        "        else:\n            out.append(str(i))\n    return out",
        ((5,), (15,)),
        ((0,), (1,), (30,)),
        lambda r: (r.randint(1, 40),),
        (
            {"a": 3, "b": 5, "wa": "Fizz", "wb": "Buzz"},
            {"a": 2, "b": 7, "wa": "Foo", "wb": "Bar"},
            {"a": 4, "b": 6, "wa": "Ping", "wb": "Pong"},
        ),
    ),
    Problem(
        "running_sum",
        "def running_sum(xs: list) -> list:",
        "Return the running totals of xs: element i is xs[0] + ... + xs[i].",
        "    out, total = [], 0\n    for x in xs:\n        total += x\n        out.append(total)\n    return out",
        (([1, 2, 3],), ([5, -2],)),
        (([],), ([0],), ([-1, -1, -1],)),
        lambda r: (_ints(r),),
    ),
    Problem(
        "count_vowels",
        "def count_vowels(s: str) -> int:",
        "Return how many characters of s are vowels (a, e, i, o, u, either case).",
        "    return sum(1 for c in s.lower() if c in 'aeiou')",
        (("hello",), ("AEIOU xyz",)),
        (("",), ("rhythm",), ("Queueing",)),
        lambda r: (_text(r),),
    ),
    Problem(
        "second_largest",
        "def second_largest(xs: list):",
        "Return the second largest distinct value in xs, or None if there are fewer than two.",
        "    distinct = sorted(set(xs))\n    return distinct[-2] if len(distinct) >= 2 else None",
        (([3, 1, 2],), ([5, 5, 4],)),
        (([],), ([7],), ([2, 2, 2],)),
        lambda r: (_ints(r, 0, 7, 0, 9),),
    ),
    Problem(
        "factorial",
        "def factorial(n: int) -> int:",
        "Return n! for n >= 0 (0! is 1).",
        "    result = 1\n    for i in range(2, n + 1):\n        result *= i\n    return result",
        ((3,), (5,)),
        ((0,), (1,), (12,)),
        lambda r: (r.randint(0, 20),),
    ),
    Problem(
        "fibonacci",
        "def fibonacci(n: int) -> int:",
        "Return the n-th Fibonacci number, with fibonacci(0) == 0 and fibonacci(1) == 1.",
        "    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a",
        ((1,), (6,)),
        ((0,), (2,), (30,)),
        lambda r: (r.randint(0, 60),),
    ),
    Problem(
        "is_prime",
        "def is_prime(n: int) -> bool:",
        "Return True if n is a prime number (numbers below 2 are not prime).",
        "    if n < 2:\n        return False\n    i = 2\n    while i * i <= n:\n"
        "        if n % i == 0:\n            return False\n        i += 1\n    return True",
        ((7,), (10,)),
        ((0,), (1,), (2,), (97,), (-7,)),
        lambda r: (r.randint(0, 500),),
    ),
    Problem(
        "gcd",
        "def gcd(a: int, b: int) -> int:",
        "Return the greatest common divisor of two non-negative integers (gcd(0, 0) is 0).",
        "    while b:\n        a, b = b, a % b\n    return a",
        ((12, 18), (7, 5)),
        ((0, 0), (0, 9), (9, 0)),
        lambda r: (r.randint(0, 200), r.randint(0, 200)),
    ),
    Problem(
        "flatten",
        "def flatten(xss: list) -> list:",
        "Flatten one level: return the items of the inner lists of xss, in order.",
        "    return [x for xs in xss for x in xs]",
        (([[1, 2], [3]],), ([[], ["a"]],)),
        (([],), ([[]],), ([[1], [2], [3, 4, 5]],)),
        lambda r: ([_ints(r, 0, 3) for _ in range(r.randint(0, 4))],),
    ),
    Problem(
        "dedupe",
        "def dedupe(xs: list) -> list:",
        "Return xs without repeated values, keeping the first occurrence of each, in order.",
        "    seen, out = set(), []\n    for x in xs:\n        if x not in seen:\n"
        "            seen.add(x)\n            out.append(x)\n    return out",
        (([1, 2, 1, 3],), (["a", "a"],)),
        (([],), ([5, 5, 5],), ([3, 2, 1, 2, 3],)),
        lambda r: (_ints(r, 0, 9, 0, 5),),
    ),
    Problem(
        "word_count",
        "def word_count(s: str) -> dict:",
        "Return a dict mapping each whitespace-separated word of s to how often it occurs.",
        "    counts = dict()\n    for w in s.split():\n        counts[w] = counts.get(w, 0) + 1\n    return counts",
        (("a b a",), ("x",)),
        (("",), ("the the the",), ("Dog dog",)),
        lambda r: (_words(r, 0, 8),),
    ),
    Problem(
        "title_case",
        "def title_case(s: str) -> str:",
        "Capitalise the first letter of each word and lowercase the rest; join words by single spaces.",
        "    return ' '.join(w[0].upper() + w[1:].lower() for w in s.split())",
        (("hello world",), ("pYTHON is FUN",)),
        (("",), ("a",), ("  two   spaces ",)),
        lambda r: (" ".join(w.upper() if r.random() < 0.3 else w for w in _words(r).split()),),
    ),
    Problem(
        "sum_digits",
        "def sum_digits(n: int) -> int:",
        "Return the sum of the decimal digits of n (ignore a minus sign).",
        "    return sum(int(d) for d in str(abs(n)))",
        ((123,), (-45,)),
        ((0,), (9,), (1000,)),
        lambda r: (r.randint(-99999, 99999),),
    ),
    Problem(
        "rotate_right",
        "def rotate_right(xs: list, k: int) -> list:",
        "Return xs rotated right by k positions (k may exceed the length; [] stays []).",
        "    if not xs:\n        return []\n    k %= len(xs)\n    return xs[-k:] + xs[:-k] if k else list(xs)",
        (([1, 2, 3, 4], 1), ([1, 2, 3], 5)),
        (([], 3), ([1], 0), ([1, 2], 2)),
        lambda r: (_ints(r, 0, 6), r.randint(0, 9)),
    ),
    Problem(
        "chunk",
        "def chunk(xs: list, size: int) -> list:",
        "Split xs into consecutive lists of length size; the last one may be shorter.",
        "    return [xs[i:i + size] for i in range(0, len(xs), size)]",
        (([1, 2, 3, 4, 5], 2), (["a", "b"], 3)),
        (([], 2), ([1, 2, 3], 1), ([1, 2, 3], 3)),
        lambda r: (_ints(r, 0, 9), r.randint(1, 4)),
    ),
    Problem(
        "sum_multiples",
        "def sum_multiples(n: int) -> int:",
        "Return the sum of all numbers from 1 to n - 1 that are multiples of {a} or {b}.",
        "    return sum(i for i in range(1, n) if i % {a} == 0 or i % {b} == 0)",
        ((10,), (16,)),
        ((0,), (1,), (100,)),
        lambda r: (r.randint(0, 300),),
        ({"a": 3, "b": 5}, {"a": 2, "b": 7}, {"a": 4, "b": 9}),
    ),
    Problem(
        "count_char",
        "def count_char(s: str, c: str) -> int:",
        "Return how many times the character c occurs in s (case-sensitive).",
        "    return sum(1 for x in s if x == c)",
        (("banana", "a"), ("Hello", "h")),
        (("", "a"), ("aaa", "a"), ("abc", "z")),
        lambda r: (_text(r), r.choice("abcAB ")),
    ),
    Problem(
        "caesar",
        "def caesar(s: str) -> str:",
        "Shift every letter of s forward by {k} places in the alphabet, wrapping z to a and "
        "keeping case; leave other characters unchanged.",
        "    out = []\n    for ch in s:\n        if ch.islower():\n"
        "            out.append(chr((ord(ch) - 97 + {k}) % 26 + 97))\n        elif ch.isupper():\n"
        "            out.append(chr((ord(ch) - 65 + {k}) % 26 + 65))\n        else:\n"
        "            out.append(ch)\n    return ''.join(out)",
        (("abc",), ("Hello, World!",)),
        (("",), ("xyz",), ("XYZ 123",)),
        lambda r: (_text(r),),
        ({"k": 1}, {"k": 3}, {"k": 13}),
    ),
    Problem(
        "to_binary",
        "def to_binary(n: int) -> str:",
        "Return the binary representation of n >= 0 without a prefix (to_binary(0) is '0').",
        "    return format(n, 'b')",
        ((5,), (8,)),
        ((0,), (1,), (255,)),
        lambda r: (r.randint(0, 5000),),
    ),
    Problem(
        "merge_sorted",
        "def merge_sorted(a: list, b: list) -> list:",
        "Merge two sorted lists into one sorted list, keeping duplicates.",
        "    return sorted(a + b)",
        (([1, 3], [2, 4]), ([1], [])),
        (([], []), ([1, 1], [1]), ([5], [1, 2, 3])),
        lambda r: (_sorted_ints(r), _sorted_ints(r)),
    ),
    Problem(
        "is_anagram",
        "def is_anagram(a: str, b: str) -> bool:",
        "Return True if a and b contain the same letters, ignoring spaces and case.",
        "    norm = lambda s: sorted(s.replace(' ', '').lower())\n    return norm(a) == norm(b)",
        (("listen", "silent"), ("abc", "abd")),
        (("", ""), ("Dormitory", "dirty room"), ("aa", "a")),
        _anagram_pair,
    ),
    Problem(
        "longest_word",
        "def longest_word(s: str) -> str:",
        "Return the longest word of s (the first one if tied), or '' if s has no words.",
        "    best = ''\n    for w in s.split():\n        if len(w) > len(best):\n            best = w\n    return best",
        (("the quick brown fox",), ("hi yo",)),
        (("",), ("one",), ("ab cd ef",)),
        lambda r: (_words(r, 0, 6),),
    ),
    Problem(
        "reverse_digits",
        "def reverse_digits(n: int) -> int:",
        "Return the integer whose decimal digits are those of n >= 0 reversed (120 -> 21).",
        "    return int(str(n)[::-1])",
        ((123,), (120,)),
        ((0,), (5,), (1000,)),
        lambda r: (r.randint(0, 99999),),
    ),
    Problem(
        "count_evens",
        "def count_evens(xs: list) -> int:",
        "Return how many numbers in xs are even.",
        "    return sum(1 for x in xs if x % 2 == 0)",
        (([1, 2, 4],), ([3, 5],)),
        (([],), ([0],), ([-2, -3],)),
        lambda r: (_ints(r),),
    ),
    Problem(
        "clamp_all",
        "def clamp_all(xs: list, lo: int, hi: int) -> list:",
        "Return xs with every value below lo replaced by lo and every value above hi by hi.",
        "    return [min(max(x, lo), hi) for x in xs]",
        (([1, 5, 10], 2, 8), ([-3], 0, 0)),
        (([], 0, 1), ([4, 4], 4, 4), ([9, -9], -5, 5)),
        _clamp_args,
    ),
    Problem(
        "differences",
        "def differences(xs: list) -> list:",
        "Return the differences between consecutive elements: xs[i + 1] - xs[i].",
        "    return [b - a for a, b in zip(xs, xs[1:])]",
        (([1, 4, 9],), ([5, 3],)),
        (([],), ([7],), ([2, 2, 2],)),
        lambda r: (_ints(r),),
    ),
    Problem(
        "run_length",
        "def run_length(s: str) -> str:",
        "Run-length encode s: each run of a repeated character becomes the character and the "
        "run length ('aaab' -> 'a3b1').",
        "    out, i = [], 0\n    while i < len(s):\n        j = i\n        while j < len(s) and s[j] == s[i]:\n"
        "            j += 1\n        out.append(s[i] + str(j - i))\n        i = j\n    return ''.join(out)",
        (("aaab",), ("abc",)),
        (("",), ("zzzz",), ("aabbaa",)),
        _runs,
    ),
    Problem(
        "transpose",
        "def transpose(m: list) -> list:",
        "Return the transpose of a rectangular matrix given as a list of rows.",
        "    return [list(col) for col in zip(*m)]",
        (([[1, 2], [3, 4]],), ([[1, 2, 3]],)),
        (([[5]],), ([[1], [2]],)),
        _matrix,
    ),
    Problem(
        "product",
        "def product(xs: list) -> int:",
        "Return the product of the numbers in xs (1 for an empty list).",
        "    result = 1\n    for x in xs:\n        result *= x\n    return result",
        (([2, 3, 4],), ([],)),
        (([0, 5],), ([-1, -1, -1],), ([7],)),
        lambda r: (_ints(r, 0, 6, -9, 9),),
    ),
    Problem(
        "common_sorted",
        "def common_sorted(a: list, b: list) -> list:",
        "Return the values that occur in both a and b, sorted ascending, without duplicates.",
        "    return sorted(set(a) & set(b))",
        (([1, 2, 3], [2, 3, 4]), ([1, 1], [1])),
        (([], [1]), ([5, 6], [7, 8]), ([3, 1], [1, 3, 3])),
        lambda r: (_ints(r, 0, 8, 0, 9), _ints(r, 0, 8, 0, 9)),
    ),
    Problem(
        "snake_to_camel",
        "def snake_to_camel(s: str) -> str:",
        "Convert snake_case to camelCase: 'hello_big_world' -> 'helloBigWorld'.",
        "    first, *rest = s.split('_')\n    return first + ''.join(w.capitalize() for w in rest)",
        (("hello_world",), ("a_b_c",)),
        (("",), ("word",), ("x_y",)),
        _snake,
    ),
    Problem(
        "count_long_words",
        "def count_long_words(s: str) -> int:",
        "Return how many words of s have more than {k} characters.",
        "    return sum(1 for w in s.split() if len(w) > {k})",
        (("a quick brown fox jumps",), ("tiny",)),
        (("",), ("abcdefghij",), ("ab abc abcd abcde abcdef",)),
        lambda r: (_words(r, 0, 7),),
        ({"k": 3}, {"k": 4}, {"k": 5}),
    ),
    Problem(
        "is_sorted",
        "def is_sorted(xs: list) -> bool:",
        "Return True if xs is in non-decreasing order.",
        "    return all(a <= b for a, b in zip(xs, xs[1:]))",
        (([1, 2, 2, 5],), ([3, 1],)),
        (([],), ([1],), ([2, 1, 3],)),
        lambda r: (sorted(_ints(r)) if r.random() < 0.5 else _ints(r),),
    ),
    Problem(
        "remove_vowels",
        "def remove_vowels(s: str) -> str:",
        "Return s with all vowels (a, e, i, o, u, either case) removed.",
        "    return ''.join(c for c in s if c.lower() not in 'aeiou')",
        (("hello",), ("AEIOUxyz",)),
        (("",), ("rhythm",), ("aaa",)),
        lambda r: (_text(r),),
    ),
    Problem(
        "is_power_of_two",
        "def is_power_of_two(n: int) -> bool:",
        "Return True if n is a positive power of two (1, 2, 4, 8, ...).",
        "    return n > 0 and n & (n - 1) == 0",
        ((8,), (6,)),
        ((0,), (1,), (-4,), (1024,)),
        lambda r: (2 ** r.randint(0, 20) if r.random() < 0.5 else r.randint(-5, 5000),),
    ),
    Problem(
        "index_of_max",
        "def index_of_max(xs: list) -> int:",
        "Return the index of the largest value in xs (the first one if tied), or -1 if xs is empty.",
        "    if not xs:\n        return -1\n    return xs.index(max(xs))",
        (([1, 9, 3],), ([4, 4],)),
        (([],), ([-5],), ([1, 2, 3],)),
        lambda r: (_ints(r, 0, 8, 0, 9),),
    ),
    Problem(
        "every_nth",
        "def every_nth(xs: list) -> list:",
        "Return every {n}th element of xs, starting with the first one.",
        "    return xs[::{n}]",
        (([1, 2, 3, 4, 5, 6, 7],), (["a", "b"],)),
        (([],), ([1],), ([0, 0, 0, 0, 0, 0, 0, 0, 0],)),
        lambda r: (_ints(r, 0, 12),),
        ({"n": 2}, {"n": 3}),
    ),
    Problem(
        "word_lengths",
        "def word_lengths(s: str) -> list:",
        "Return the lengths of the whitespace-separated words of s, in order.",
        "    return [len(w) for w in s.split()]",
        (("hi there",), ("a bb ccc",)),
        (("",), ("  x  ",), ("one two three",)),
        lambda r: (_words(r, 0, 6),),
    ),
    Problem(
        "acronym",
        "def acronym(s: str) -> str:",
        "Return the upper-case first letters of the words of s: 'portable network graphics' -> 'PNG'.",
        "    return ''.join(w[0].upper() for w in s.split())",
        (("portable network graphics",), ("as soon as possible",)),
        (("",), ("x",), ("  spaced  words ",)),
        lambda r: (_words(r),),
    ),
    Problem(
        "sum_of_squares",
        "def sum_of_squares(xs: list) -> int:",
        "Return the sum of the squares of the numbers in xs.",
        "    return sum(x * x for x in xs)",
        (([1, 2, 3],), ([-2],)),
        (([],), ([0],), ([10, -10],)),
        lambda r: (_ints(r),),
    ),
]

# The easy tier: one-line functions, the simplest rung for small policies. Split by hash like
# the others (3 of these 12 are test problems). How the embedded model does on them:
# docs/environments.md#python-tasks.
EASY: list[Problem] = [
    Problem("add_k", "def add_k(x: int) -> int:", "Return x plus {k}.", "    return x + {k}",
            ((1,), (10,)), ((0,), (-5,), (100,)), lambda r: (r.randint(-50, 50),),
            ({"k": 1}, {"k": 5}, {"k": 10})),
    Problem("negate", "def negate(x: int) -> int:", "Return -x.", "    return -x",
            ((3,), (-4,)), ((0,), (1,), (-100,)), lambda r: (r.randint(-99, 99),)),
    Problem("keep_positive", "def keep_positive(xs: list) -> list:",
            "Return the numbers of xs that are greater than 0, in order.",
            "    return [x for x in xs if x > 0]", (([1, -2, 3],), ([-1],)),
            (([],), ([0],), ([5, 5],)), lambda r: (_ints(r),)),
    Problem("square", "def square(x: int) -> int:", "Return x squared.", "    return x * x",
            ((3,), (-2,)), ((0,), (1,), (12,)), lambda r: (r.randint(-30, 30),)),
    Problem("is_even", "def is_even(x: int) -> bool:", "Return True if x is even.",
            "    return x % 2 == 0", ((4,), (7,)), ((0,), (-3,), (100,)),
            lambda r: (r.randint(-99, 99),)),
    Problem("last_item", "def last_item(xs: list):", "Return the last element of xs (not empty).",
            "    return xs[-1]", (([1, 2, 3],), (["a"],)), (([0],), ([5, 4],), ([-1, 0, 1],)),
            lambda r: (_ints(r, 1, 8),)),
    Problem("list_length", "def list_length(xs: list) -> int:",
            "Return the number of elements in xs.", "    return len(xs)", (([1, 2, 3],), ([],)),
            (([0],), ([5, 5, 5, 5],), ([[], []],)), lambda r: (_ints(r),)),
    Problem("sum_list", "def sum_list(xs: list) -> int:", "Return the sum of the numbers in xs.",
            "    return sum(xs)", (([1, 2, 3],), ([],)), (([-5],), ([0, 0],), ([10, -10, 3],)),
            lambda r: (_ints(r),)),
    Problem("max_value", "def max_value(xs: list) -> int:",
            "Return the largest number in xs (not empty).", "    return max(xs)",
            (([1, 5, 3],), ([-2, -7],)), (([0],), ([4, 4],), ([-1, 0, 1],)),
            lambda r: (_ints(r, 1, 8),)),
    Problem("shout", "def shout(s: str) -> str:", "Return s in upper case.",
            "    return s.upper()", (("hello",), ("Hi there",)), (("",), ("ABC",), ("x1!",)),
            lambda r: (_words(r),)),
    Problem("double_all", "def double_all(xs: list) -> list:",
            "Return a list with every number of xs doubled.", "    return [2 * x for x in xs]",
            (([1, 2, 3],), ([-1],)), (([],), ([0],), ([5, -5],)), lambda r: (_ints(r),)),
    Problem("absolute", "def absolute(x: int) -> int:",
            "Return the absolute value of x.", "    return abs(x)",
            ((-3,), (4,)), ((0,), (-100,), (7,)), lambda r: (r.randint(-99, 99),)),
]
PROBLEMS += EASY
