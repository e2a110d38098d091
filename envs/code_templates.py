"""Programming-task templates for the code domain: statement, reference, plausible wrong programs,
input generators and edge cases. Pure data + trusted reference code (run in-process to compute the
expected outputs; model-written code never runs here, only in envs.sandbox).

Each template has a basic spec and a strict spec (a stricter signature: one more parameter that
changes the contract). `mutants` are typical wrong answers: some fail only on edge cases, which is
what makes the edge-case knob bite for a random policy choosing among programs.
"""

from __future__ import annotations

import random
import string
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import Any

Args = list[Any]


@dataclass(frozen=True)
class Spec:
    func: str
    signature: str  # e.g. "def sum_evens(nums: list[int]) -> int"
    doc: str
    reference: str
    mutants: tuple[str, ...]


@dataclass(frozen=True)
class Template:
    name: str
    family: int  # 0: basic families (level 0 draws only these), 1: harder ones
    basic: Spec
    strict: Spec
    typical: Callable[[random.Random, bool], Args]  # (rng, strict) -> arguments of one call
    edge: Callable[[bool], list[Args]]  # strict -> edge-case arguments


def _words(rng: random.Random, n: int, letters: str = string.ascii_lowercase) -> list[str]:
    return ["".join(rng.choice(letters) for _ in range(rng.randint(1, 7))) for _ in range(n)]


def _ints(rng: random.Random, lo: int, hi: int, n_lo: int = 3, n_hi: int = 9) -> list[int]:
    return [rng.randint(lo, hi) for _ in range(rng.randint(n_lo, n_hi))]


def _spec(func: str, signature: str, doc: str, reference: str, *mutants: str) -> Spec:
    return Spec(func, signature, doc, reference.strip() + "\n", tuple(m.strip() + "\n" for m in mutants))


TEMPLATES: tuple[Template, ...] = (
    Template(
        "sum_evens",
        0,
        _spec(
            "sum_evens",
            "def sum_evens(nums: list[int]) -> int",
            "Return the sum of the even numbers in `nums` (0 if there are none).",
            "def sum_evens(nums):\n    return sum(x for x in nums if x % 2 == 0)",
            "def sum_evens(nums):\n    return sum(x for x in nums if x > 0 and x % 2 == 0)",
            "def sum_evens(nums):\n    return sum(nums[::2])",
            "def sum_evens(nums):\n    return sum(x for x in nums if x % 2 == 1)",
        ),
        _spec(
            "sum_multiples",
            "def sum_multiples(nums: list[int], k: int) -> int",
            "Return the sum of the numbers in `nums` that are divisible by `k` (k != 0, may be negative).",
            "def sum_multiples(nums, k):\n    return sum(x for x in nums if x % k == 0)",
            "def sum_multiples(nums, k):\n    return sum(x for x in nums if x > 0 and x % k == 0)",
            "def sum_multiples(nums, k):\n    return sum(x for x in nums if x % 2 == 0)",
        ),
        lambda rng, strict: [_ints(rng, 0, 30)] + ([rng.randint(2, 5)] if strict else []),
        lambda strict: (
            [[[]], [[-4, -3, 6]], [[-2]], [[0, 0, 7]]]
            if not strict
            else [[[], 3], [[-6, -4, 9], 3], [[10, -5, 3], -5]]
        ),
    ),
    Template(
        "count_vowels",
        0,
        _spec(
            "count_vowels",
            "def count_vowels(s: str) -> int",
            "Return how many characters of `s` are vowels (a, e, i, o, u, in either case).",
            "def count_vowels(s):\n    return sum(1 for c in s.lower() if c in 'aeiou')",
            "def count_vowels(s):\n    return sum(1 for c in s if c in 'aeiou')",
            "def count_vowels(s):\n    return sum(1 for c in s.lower() if c in 'aeiouy')",
            "def count_vowels(s):\n    return len([c for c in s if c != ' '])",
        ),
        _spec(
            "count_vowels",
            "def count_vowels(s: str, include_y: bool) -> int",
            "Return how many characters of `s` are vowels (a, e, i, o, u, in either case); when "
            "`include_y` is true, y and Y count as vowels too.",
            "def count_vowels(s, include_y):\n    v = 'aeiouy' if include_y else 'aeiou'\n"
            "    return sum(1 for c in s.lower() if c in v)",
            "def count_vowels(s, include_y):\n    v = 'aeiouy' if include_y else 'aeiou'\n"
            "    return sum(1 for c in s if c in v)",
            "def count_vowels(s, include_y):\n    return sum(1 for c in s.lower() if c in 'aeiou')",
        ),
        lambda rng, strict: (
            [" ".join(_words(rng, rng.randint(1, 4), "abcdefghijklmnopqrstuvwx"))]
            + ([rng.random() < 0.5] if strict else [])
        ),
        lambda strict: [
            [s] + ([y] if strict else [])
            for s, y in [("", True), ("AEIOU xyz", True), ("Rhythm", False), ("QUEUE", True)]
        ],
    ),
    Template(
        "reverse_words",
        0,
        _spec(
            "reverse_words",
            "def reverse_words(s: str) -> str",
            "Return the words of `s` (separated by any whitespace) in reverse order, joined by single "
            "spaces, with no leading or trailing space.",
            "def reverse_words(s):\n    return ' '.join(s.split()[::-1])",
            "def reverse_words(s):\n    return ' '.join(s.split(' ')[::-1])",
            "def reverse_words(s):\n    return s[::-1]",
            "def reverse_words(s):\n    return ' '.join(w[::-1] for w in s.split())",
        ),
        _spec(
            "reverse_words",
            "def reverse_words(s: str, sep: str) -> str",
            "Split `s` on the separator string `sep`, drop empty pieces, and return the pieces in reverse "
            "order joined by `sep`.",
            "def reverse_words(s, sep):\n    return sep.join([w for w in s.split(sep) if w][::-1])",
            "def reverse_words(s, sep):\n    return sep.join(s.split(sep)[::-1])",
            "def reverse_words(s, sep):\n    return ' '.join(s.split()[::-1])",
        ),
        lambda rng, strict: (
            [",".join(_words(rng, rng.randint(2, 5))), ","]
            if strict
            else [" ".join(_words(rng, rng.randint(1, 5)))]
        ),
        lambda strict: (
            [["", ","], [",,a,,b,", ","], ["x", ","], ["a--b--c", "--"]]
            if strict
            else [[""], ["  hello   world "], ["one"], ["a\tb"]]
        ),
    ),
    Template(
        "fizzbuzz",
        0,
        _spec(
            "fizzbuzz",
            "def fizzbuzz(n: int) -> str",
            "Return 'FizzBuzz' if `n` is divisible by both 3 and 5, 'Fizz' if only by 3, 'Buzz' if only by 5, "
            "and otherwise the decimal string of `n`.",
            "def fizzbuzz(n):\n    if n % 15 == 0:\n        return 'FizzBuzz'\n    if n % 3 == 0:\n"
            "        return 'Fizz'\n    if n % 5 == 0:\n        return 'Buzz'\n    return str(n)",
            "def fizzbuzz(n):\n    if n % 3 == 0:\n        return 'Fizz'\n    if n % 5 == 0:\n        return 'Buzz'\n"
            "    if n % 15 == 0:\n        return 'FizzBuzz'\n    return str(n)",
            "def fizzbuzz(n):\n    if n % 15 == 0:\n        return 'FizzBuzz'\n    if n % 3 == 0:\n"
            "        return 'Fizz'\n    if n % 5 == 0:\n        return 'Buzz'\n    return n",
        ),
        _spec(
            "fizzbuzz",
            "def fizzbuzz(n: int, a: int, b: int) -> str",
            "Return 'FizzBuzz' if `n` is divisible by both `a` and `b`, 'Fizz' if only by `a`, 'Buzz' if only "
            "by `b`, and otherwise the decimal string of `n`.",
            "def fizzbuzz(n, a, b):\n    if n % a == 0 and n % b == 0:\n        return 'FizzBuzz'\n"
            "    if n % a == 0:\n        return 'Fizz'\n    if n % b == 0:\n        return 'Buzz'\n    return str(n)",
            "def fizzbuzz(n, a, b):\n    if n % (a * b) == 0:\n        return 'FizzBuzz'\n"
            "    if n % a == 0:\n        return 'Fizz'\n    if n % b == 0:\n        return 'Buzz'\n    return str(n)",
            "def fizzbuzz(n, a, b):\n    if n % 15 == 0:\n        return 'FizzBuzz'\n    if n % 3 == 0:\n"
            "        return 'Fizz'\n    if n % 5 == 0:\n        return 'Buzz'\n    return str(n)",
        ),
        lambda rng, strict: (
            [rng.randint(1, 100)] + ([3, 7] if strict and rng.random() < 0.5 else [2, 5] if strict else [])
        ),
        lambda strict: [[0, 4, 6], [12, 4, 6], [-8, 4, 6], [24, 4, 6]] if strict else [[15], [30], [0], [-9]],
    ),
    Template(
        "digit_sum",
        0,
        _spec(
            "digit_sum",
            "def digit_sum(n: int) -> int",
            "Return the sum of the decimal digits of the absolute value of `n`.",
            "def digit_sum(n):\n    return sum(int(c) for c in str(abs(n)))",
            "def digit_sum(n):\n    return sum(int(c) for c in str(n))",
            "def digit_sum(n):\n    return n % 9",
            "def digit_sum(n):\n    return len(str(n))",
        ),
        _spec(
            "digit_sum",
            "def digit_sum(n: int, base: int) -> int",
            "Return the sum of the digits of the absolute value of `n` written in base `base` (2 <= base <= 16).",
            "def digit_sum(n, base):\n    n = abs(n)\n    total = 0\n    while n:\n        total += n % base\n"
            "        n //= base\n    return total",
            "def digit_sum(n, base):\n    total = 0\n    while n > 0:\n        total += n % base\n"
            "        n //= base\n    return total",
            "def digit_sum(n, base):\n    return sum(int(c) for c in str(abs(n)))",
        ),
        lambda rng, strict: [rng.randint(10, 99999)] + ([rng.choice([2, 8, 16])] if strict else []),
        lambda strict: (
            [[0, 2], [-255, 16], [-7, 2], [10**12, 8]] if strict else [[0], [-123], [10**12], [-9]]
        ),
    ),
    Template(
        "max_subarray",
        1,
        _spec(
            "max_subarray",
            "def max_subarray(nums: list[int]) -> int",
            "Return the largest sum of a non-empty contiguous subarray of `nums` (`nums` is non-empty).",
            "def max_subarray(nums):\n    best = cur = nums[0]\n    for x in nums[1:]:\n"
            "        cur = max(x, cur + x)\n        best = max(best, cur)\n    return best",
            "def max_subarray(nums):\n    best = cur = 0\n    for x in nums:\n        cur = max(0, cur + x)\n"
            "        best = max(best, cur)\n    return best",
            "def max_subarray(nums):\n    return sum(x for x in nums if x > 0)",
            "def max_subarray(nums):\n    return max(nums)",
        ),
        _spec(
            "max_subarray",
            "def max_subarray(nums: list[int], allow_empty: bool) -> int",
            "Return the largest sum of a contiguous subarray of `nums`; the empty subarray (sum 0) is allowed "
            "only when `allow_empty` is true (otherwise `nums` is non-empty and the subarray must be too).",
            "def max_subarray(nums, allow_empty):\n    best = 0 if allow_empty else None\n    cur = 0\n"
            "    for x in nums:\n        cur = x if cur < 0 else cur + x\n"
            "        best = cur if best is None else max(best, cur)\n    return best if best is not None else 0",
            "def max_subarray(nums, allow_empty):\n    best = cur = 0\n    for x in nums:\n"
            "        cur = max(0, cur + x)\n        best = max(best, cur)\n    return best",
            "def max_subarray(nums, allow_empty):\n    best = cur = nums[0]\n    for x in nums[1:]:\n"
            "        cur = max(x, cur + x)\n        best = max(best, cur)\n    return best",
        ),
        lambda rng, strict: (
            [_ints(rng, -9, 9, 4, 10) + [rng.randint(1, 9)]] + ([rng.random() < 0.5] if strict else [])
        ),
        lambda strict: (
            [[[-3, -1, -2], False], [[-5], False], [[], True], [[-2, -1], True]]
            if strict
            else [[[-3, -1, -2]], [[-5]], [[0]], [[-2, 0, -1]]]
        ),
    ),
    Template(
        "second_largest",
        1,
        _spec(
            "second_largest",
            "def second_largest(nums: list[int]) -> int | None",
            "Return the second largest DISTINCT value in `nums`, or None if `nums` has fewer than two distinct values.",
            "def second_largest(nums):\n    d = sorted(set(nums))\n    return d[-2] if len(d) >= 2 else None",
            "def second_largest(nums):\n    return sorted(nums)[-2]",
            "def second_largest(nums):\n    return sorted(set(nums))[-2]",
            "def second_largest(nums):\n    return max(nums)",
        ),
        _spec(
            "kth_largest",
            "def kth_largest(nums: list[int], k: int) -> int | None",
            "Return the k-th largest DISTINCT value in `nums` (k >= 1), or None if `nums` has fewer than k distinct values.",
            "def kth_largest(nums, k):\n    d = sorted(set(nums), reverse=True)\n    return d[k - 1] if len(d) >= k else None",
            "def kth_largest(nums, k):\n    return sorted(nums, reverse=True)[k - 1]",
            "def kth_largest(nums, k):\n    d = sorted(set(nums), reverse=True)\n    return d[k] if len(d) > k else None",
        ),
        lambda rng, strict: (
            [rng.sample(range(-50, 50), rng.randint(3, 8))] + ([rng.randint(1, 3)] if strict else [])
        ),
        lambda strict: (
            [[[5, 5, 3], 2], [[7], 1], [[], 1], [[2, 2, 2], 2]]
            if strict
            else [[[5, 5, 3]], [[7]], [[]], [[2, 2]]]
        ),
    ),
    Template(
        "run_length",
        1,
        _spec(
            "run_length",
            "def run_length(s: str) -> str",
            "Run-length encode `s`: each maximal run of one character becomes the character followed by the "
            "run length, e.g. 'aaabcc' -> 'a3b1c2' ('' -> '').",
            "def run_length(s):\n    out = []\n    i = 0\n    while i < len(s):\n        j = i\n"
            "        while j < len(s) and s[j] == s[i]:\n            j += 1\n        out.append(s[i] + str(j - i))\n"
            "        i = j\n    return ''.join(out)",
            "def run_length(s):\n    out = []\n    cur, n = s[0], 0\n    for c in s:\n        if c == cur:\n"
            "            n += 1\n        else:\n            out.append(cur + str(n))\n            cur, n = c, 1\n"
            "    out.append(cur + str(n))\n    return ''.join(out)",
            "def run_length(s):\n    out = []\n    i = 0\n    while i < len(s):\n        j = i\n"
            "        while j < len(s) and s[j] == s[i]:\n            j += 1\n"
            "        out.append(s[i] + (str(j - i) if j - i > 1 else ''))\n        i = j\n    return ''.join(out)",
            "def run_length(s):\n    return ''.join(c + str(s.count(c)) for c in dict.fromkeys(s))",
        ),
        _spec(
            "run_length",
            "def run_length(s: str, case_insensitive: bool) -> str",
            "Run-length encode `s` ('aaabcc' -> 'a3b1c2'); when `case_insensitive` is true, characters that "
            "differ only in case belong to the same run, which is written with its first character.",
            "def run_length(s, case_insensitive):\n    key = (lambda c: c.lower()) if case_insensitive else (lambda c: c)\n"
            "    out = []\n    i = 0\n    while i < len(s):\n        j = i\n"
            "        while j < len(s) and key(s[j]) == key(s[i]):\n            j += 1\n"
            "        out.append(s[i] + str(j - i))\n        i = j\n    return ''.join(out)",
            "def run_length(s, case_insensitive):\n    if case_insensitive:\n        s = s.lower()\n    out = []\n"
            "    i = 0\n    while i < len(s):\n        j = i\n        while j < len(s) and s[j] == s[i]:\n"
            "            j += 1\n        out.append(s[i] + str(j - i))\n        i = j\n    return ''.join(out)",
        ),
        lambda rng, strict: (
            ["".join(rng.choice("abc") * rng.randint(1, 3) for _ in range(rng.randint(1, 5)))]
            + ([False] if strict else [])
        ),
        lambda strict: (
            [["", True], ["aAab", True], ["Zz", False], ["BbB", True]]
            if strict
            else [[""], ["a"], ["abab"], ["zzzzzzzzzzzz"]]
        ),
    ),
    Template(
        "is_palindrome",
        1,
        _spec(
            "is_palindrome",
            "def is_palindrome(s: str) -> bool",
            "Return True if `s` reads the same forwards and backwards when only letters and digits are "
            "considered and case is ignored, else False.",
            "def is_palindrome(s):\n    t = [c.lower() for c in s if c.isalnum()]\n    return t == t[::-1]",
            "def is_palindrome(s):\n    return s == s[::-1]",
            "def is_palindrome(s):\n    return s.lower() == s.lower()[::-1]",
            "def is_palindrome(s):\n    return s[0] == s[-1]",
        ),
        _spec(
            "is_palindrome",
            "def is_palindrome(s: str, ignore_case: bool) -> bool",
            "Return True if `s` reads the same forwards and backwards when only letters and digits are "
            "considered; case is ignored only when `ignore_case` is true.",
            "def is_palindrome(s, ignore_case):\n    t = [c.lower() if ignore_case else c for c in s if c.isalnum()]\n"
            "    return t == t[::-1]",
            "def is_palindrome(s, ignore_case):\n    t = [c.lower() for c in s if c.isalnum()]\n    return t == t[::-1]",
            "def is_palindrome(s, ignore_case):\n    return s == s[::-1]",
        ),
        lambda rng, strict: [_maybe_palindrome(rng)] + ([True] if strict else []),
        lambda strict: (
            [["", True], ["Abba", False], ["No 'x' in Nixon", True], ["ab", True]]
            if strict
            else [[""], ["A man, a plan, a canal: Panama"], ["No 'x' in Nixon"], ["ab!"]]
        ),
    ),
    Template(
        "merge_sorted",
        1,
        _spec(
            "merge_sorted",
            "def merge_sorted(a: list[int], b: list[int]) -> list[int]",
            "Merge the ascending lists `a` and `b` into one ascending list that keeps every element (duplicates too).",
            "def merge_sorted(a, b):\n    out, i, j = [], 0, 0\n    while i < len(a) and j < len(b):\n"
            "        if a[i] <= b[j]:\n            out.append(a[i]); i += 1\n        else:\n"
            "            out.append(b[j]); j += 1\n    return out + a[i:] + b[j:]",
            "def merge_sorted(a, b):\n    return sorted(set(a + b))",
            "def merge_sorted(a, b):\n    return a + b",
            "def merge_sorted(a, b):\n    return [x for pair in zip(a, b) for x in sorted(pair)]",
        ),
        _spec(
            "merge_sorted",
            "def merge_sorted(a: list[int], b: list[int], dedupe: bool) -> list[int]",
            "Merge the ascending lists `a` and `b` into one ascending list; when `dedupe` is true each value "
            "appears once, otherwise every element is kept.",
            "def merge_sorted(a, b, dedupe):\n    out = sorted(a + b)\n"
            "    return sorted(set(out)) if dedupe else out",
            "def merge_sorted(a, b, dedupe):\n    return sorted(set(a + b))",
            "def merge_sorted(a, b, dedupe):\n    return sorted(a + b)",
        ),
        lambda rng, strict: _disjoint_sorted(rng) + ([rng.random() < 0.5] if strict else []),
        lambda strict: (
            [[[], [], True], [[1, 1, 2], [1, 3], False], [[1, 1, 2], [1, 3], True], [[2], [], False]]
            if strict
            else [[[], []], [[1, 1, 2], [1, 3]], [[5], []], [[], [0, 0]]]
        ),
    ),
)


def _maybe_palindrome(rng: random.Random) -> str:
    half = "".join(rng.choice("abcde") for _ in range(rng.randint(1, 4)))
    if rng.random() < 0.5:
        return half + rng.choice(["", "x"]) + half[::-1]
    return half + rng.choice("fgh") + half


def _disjoint_sorted(rng: random.Random) -> Args:
    values = rng.sample(range(0, 60), rng.randint(2, 9))
    cut = rng.randint(0, len(values))
    return [sorted(values[:cut]), sorted(values[cut:])]


BY_NAME: dict[str, Template] = {t.name: t for t in TEMPLATES}


@cache
def compiled(source: str, func: str) -> Callable[..., Any]:
    """A function from TRUSTED source (our references and mutants only)."""
    namespace: dict[str, Any] = {}
    exec(compile(source, f"<template {func}>", "exec"), namespace)  # noqa: S102 - trusted template code
    return namespace[func]
