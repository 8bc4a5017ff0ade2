"""Which schema ``pattern`` regexes reach llama.cpp's converter, and why the others are refused."""

from __future__ import annotations

import pytest

from bubo.grammar.pattern import MAX_GROUP_DEPTH, PatternRefused, check_pattern

# Patterns the converter translates faithfully (tests/engine checks llama.cpp parses what it makes of them).
SUPPORTED = [
    "^[a-z]+$",
    "^[0-9]{3}-[0-9]{4}$",
    "^[0-9]+[.][0-9]+$",
    "^(red|green|blue)$",
    "^(ab){2,}c?$",
    "^a*?b+?$",
    "^[^\\n\\r]*$",
    "^[\\x41-\\x5A\\u00e0-\\u00ff]{1,3}$",
    "^[a\\-z\\]]$",
    "^\\(+[0-9]\\)$",
    '^say "hi"$',
    "^.{0,1000}$",
    "^(a{1,10}){0,100}$",
    "^(a?)?(b*c)+$",
    "^(x[a-z]{1,999})*$",  # 1 + 2 * 998 = 1,997 rules in the group: within llama.cpp's 2,000
    "^$",
]


@pytest.mark.parametrize("pattern", SUPPORTED)
def test_supported_patterns_pass(pattern: str) -> None:
    """Anchored patterns of literals, classes, groups, alternatives in groups and bounded quantifiers pass."""
    check_pattern(pattern, max_repeat=1000)


@pytest.mark.parametrize(
    ("pattern", "reason"),
    [
        # invalid regular expressions
        ("^(($", "unclosed ("),
        ("^a)$", ") with no ( before it"),
        ("^*$", "* with nothing before it"),
        ("^(|+)$", "+ with nothing before it"),
        ("^a**$", "right after another quantifier"),
        ("^[z-a]$", "range z-a, which runs backwards"),
        ("^[a-z$", "[ with no ]"),
        ("^a{2,1}$", "minimum is above its maximum"),
        ("^abc\\$", "lone \\"),
        # valid regexes the converter would mistranslate, loop on or crash on
        ("^}$", "lone }"),
        ("^a]$", "lone ]"),
        ("^a{1, 2}$", "not a quantifier"),
        ("^[]$", "empty character class"),
        ("^a|b$", "| outside a group"),
        ("^a^b$", "^ inside it"),
        ("^a$b$", "$ inside it"),
        ("^(?:ab)$", "(?…) group"),
        ("^(?=a)a$", "(?…) group"),
        ("^ab\\(+$", "escape that ends a run of literal text"),
        ('^a"+$', "escape that ends a run of literal text"),
        # repeating what can be empty: ambiguity that stalls sampling (measured: 13.7 s a token at {0,100})
        ("^(a?)+$", "+ on something that can match the empty string"),
        ("^(a{0,10}){0,100}$", "{ on something that can match the empty string"),
        ("^(a|)*$", "* on something that can match the empty string"),
        ("^(b|(a*c?)){2}$", "{ on something that can match the empty string"),
        # a repeated group holding more rules than llama.cpp's parser takes
        ("^(x[a-z]{0,1000})*$", "expands to 2001 grammar rules; it takes at most 2000"),
        ("^(xa{0,600}b{0,500})+$", "expands to 2201 grammar rules"),
        # escapes outside what GBNF knows, with the replacement
        ("^\\d+$", "\\d, which the grammar conversion does not support; write [0-9]"),
        ("^[0-9]+\\.[0-9]+$", "write [.]"),
        ("^\\x41$", "write the character itself"),
        ("^[\\w]+$", "\\w inside [ ]"),
        ("^\\1$", "\\1"),
        # not anchored: llama.cpp needs the whole string
        ("[a-z]+", "must start with ^ and end with $"),
        ("^", "must start with ^ and end with $"),
    ],
)
def test_refused_patterns_say_why(pattern: str, reason: str) -> None:
    """Each refusal names what is wrong and where."""
    with pytest.raises(PatternRefused) as caught:
        check_pattern(pattern, max_repeat=1000)
    assert reason in str(caught.value)


class TestRepetition:
    def test_a_bound_over_the_limit(self) -> None:
        """A quantifier's bound is at most max_repeat: each repetition is written out."""
        check_pattern("^a{0,50}$", max_repeat=50)
        with pytest.raises(PatternRefused, match=r"\{0,51\}; at most 50"):
            check_pattern("^a{0,51}$", max_repeat=50)
        with pytest.raises(PatternRefused, match=r"\{51,\}; at most 50"):
            check_pattern("^a{51,}$", max_repeat=50)

    def test_bounds_multiply_through_groups(self) -> None:
        """A repeated group repeats what is inside it: the bounds multiply."""
        check_pattern("^(a{0,10}b){0,5}$", max_repeat=50)
        with pytest.raises(PatternRefused, match="repeats 60 times"):
            check_pattern("^(x(a{0,10}b)){0,6}$", max_repeat=50)

    def test_siblings_do_not_multiply(self) -> None:
        """Repetitions one after the other add up in the grammar; they are not multiplied."""
        check_pattern("^a{0,50}b{0,50}(c{0,50}){1}$", max_repeat=50)

    def test_group_depth(self) -> None:
        """Groups nest at most MAX_GROUP_DEPTH deep."""
        check_pattern("^" + "(" * MAX_GROUP_DEPTH + "a" + ")" * MAX_GROUP_DEPTH + "$", max_repeat=1)
        deeper = MAX_GROUP_DEPTH + 1
        with pytest.raises(PatternRefused, match=f"more than {MAX_GROUP_DEPTH} deep"):
            check_pattern("^" + "(" * deeper + "a" + ")" * deeper + "$", max_repeat=1)

    def test_long_patterns_are_read_in_one_pass(self) -> None:
        """A long pattern is read in one pass: 100,000 characters, no recursion, no error."""
        check_pattern("^(" + "a|" * 50_000 + "b)$", max_repeat=1)
