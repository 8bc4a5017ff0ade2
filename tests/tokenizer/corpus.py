"""A varied tokenizer corpus: code, CJK, emoji, whitespace runs, CRLF, chat markup, special tokens.

Deterministic (seeded) so a mismatch is reproducible.
"""

from __future__ import annotations

import random

HANDWRITTEN = [
    "",
    " ",
    "  ",
    "\n",
    "\n\n\n",
    "\r\n",
    " \r\n  \r\n",
    "\t",
    "\t\t  \t",
    "Hello world",
    " Hello",
    "hello  world",
    "I've been 'told he's there, 'RE you sure? 'M not sure I'll make it, 'D you like some tea? We'Ve a'lL",
    "3333333 33333333 1.5e10 0.000001 123,456,789 ٣٤٥ ⅕ ½",
    "日本語のテキスト。中文文本，한국어 텍스트",
    "Ελληνικά και Кириллица ПРИВЕТ мир",
    "🚀 (normal) 😶‍🌫️ (multiple emojis concatenated) ✅ 🦙🦙 3️⃣",
    "def f(x):\n    return x**2  # comment\n\nclass A:\n\tpass\n",
    "for (int i = 0; i < n; ++i) { a[i] = b[i] << 2; }",
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
    "<start_of_turn>user\nhello<end_of_turn>\n<start_of_turn>model\n",
    "<bos><eos><pad>",
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
    "<think>\nLet me think.\n</think>\n\nAnswer.",
    '```json\n{"a": [1, 2, 3]}\n```',
    "~~~ ~ tilde ~~",
    "\u00a0nbsp\u3000ideographic\u2009thin",
    "e\u0301 combining vs é",
    "ſ long s, ﬁ ligature",
    "   leading and trailing   ",
    "a" * 300,
    " " * 40 + "x",
    "x" + " " * 33,
    "\n" * 17 + "end",
    "https://example.com/path?query=1&b=2#frag",
    "user@example.com",
    "C:\\Windows\\System32",
    "<<<>>> !!! ??? ... --- ___ *** ### @@@",
    "$100 €20 £5 ¥300",
    "camelCaseWord snake_case_word kebab-case",
    "<|endoftext|><|im_end|>",
    "<|im_start|><|im_start|>",
    "< |im_start| >",
    "<|im_start",
    "im_end|>",
]

_ALPHABET = "abcXYZ 019\n\t\r.,;'\"!?-_()[]{}<>|/\\~`@#$%^&*+=éüßñ日本語中文한🚀😶\u200d\u00a0\u3000ΩЖж\u0301"
_WORDS = [
    "the",
    " quick",
    "Brown",
    "fox",
    "123",
    " 4567",
    "\n",
    "  ",
    "don't",
    "I'M",
    "x=y+1;",
    "naïve",
    "café",
    "ünïcödé",
    "<|im_end|>",
    "<|im_start|>",
    "<start_of_turn>",
    "<eos>",
    "    indent",
    "\r\n",
    "。",
    "👍🏽",
    "'s",
    "'ll",
    "  \n",
    "return",
    "{",
    "}",
    "0.5",
    "-1",
]


def corpus(size: int = 3000, seed: int = 20261130) -> list[str]:
    """*size* strings: the handwritten ones, random characters, random word salads."""
    rng = random.Random(seed)
    out = list(HANDWRITTEN)
    while len(out) < size:
        if rng.random() < 0.5:
            out.append("".join(rng.choice(_ALPHABET) for _ in range(rng.randint(1, 80))))
        else:
            out.append("".join(rng.choice(_WORDS) for _ in range(rng.randint(1, 16))))
    return out
