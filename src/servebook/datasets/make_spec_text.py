"""The source of ``spec-text.jsonl`` (``--dataset builtin:spec-text``): passages and code
written for servebook (Apache-2.0, as servebook), each asked back (repeat, copy, rewrite,
complete), so that a model's reply repeats the prompt's text and n-gram or draft-model
speculation has tokens to accept.  ``python -m servebook.datasets.make_spec_text FILE``
writes it; a unit test keeps the shipped file equal to what this writes."""

# ruff: noqa: E501 - the lines are the passages, kept whole to be read as text

from __future__ import annotations

import json
import sys

PROSE = [
    "The train left the station at seven in the morning. By noon it had crossed the river, and by evening the passengers could see the mountains. Nobody on board had slept.",
    "A good recipe lists its ingredients before its steps. The cook reads the whole recipe once, gathers everything on the counter, and only then lights the stove.",
    "The library opens at nine on weekdays and at ten on Saturdays. It is closed on Sundays and public holidays. Books may be borrowed for three weeks.",
    "Water boils at one hundred degrees Celsius at sea level. On a high mountain it boils at a lower temperature, so pasta takes longer to cook there.",
    "The meeting is moved from Tuesday to Thursday. The room stays the same, and the agenda is unchanged. Please bring the figures from last quarter.",
    "Every server in the cluster reports its temperature once a minute. When a reading is above the limit, the scheduler stops sending work to that server until it cools down.",
    "The garden has four beds: tomatoes in the first, beans in the second, onions in the third and flowers in the last. Each bed is watered every other day.",
    "To reset the device, hold the power button for ten seconds. The light will blink twice. Release the button and wait for the light to turn green.",
    "The old bridge was built of stone in the year eighteen hundred and twelve. It has five arches. Carts crossed it for a century before the first car did.",
    "Our shop sells bread, cheese and fruit. The bread is baked every morning, the cheese comes from a farm nearby, and the fruit is picked the day before it is sold.",
    "The report has three parts. The first part describes the problem, the second part describes the method, and the third part describes the results.",
    "A cache keeps a copy of recent answers. When the same question comes again, the answer is read from the cache instead of being computed again, which saves time.",
    "The river is wide and slow in the valley. In the spring it floods the fields, and in the summer it is shallow enough to walk across in many places.",
    "Please send the invoice to the accounts team by the end of the month. Include the order number, the date of delivery and the total amount.",
    "The ship carried wool to the south and brought back salt and wine. The voyage took six weeks each way when the winds were good.",
    "The first rule of the workshop is to put every tool back where it was found. The second rule is to sweep the floor before leaving.",
    "Light travels faster than sound. That is why we see the lightning before we hear the thunder, and why the delay tells us how far away the storm is.",
    "The museum has a room of clocks. Some are tall and stand on the floor, some are small enough to fit in a pocket, and all of them are set to the same time.",
    "Each student writes one page about a book they read this term. The page should say what the book is about and why the student liked or disliked it.",
    "The village has one road, one shop and one school. The bus comes twice a day, once in the morning and once in the evening.",
    "When the queue is full, new requests wait. When a request finishes, the oldest waiting request is started. No request waits longer than the one before it.",
    "The map shows the coast, the hills and the three towns between them. A dotted line marks the path that walkers use in the summer.",
    "Our team works in two week cycles. At the start of each cycle we choose the work, and at the end we show what was done and decide what to change.",
    "The bakery opens at six. The first loaves are out of the oven at half past six, and by eight the shelves are full.",
    "A lighthouse warns ships of rocks near the shore. Its lamp turns all night, and each lighthouse has its own pattern of flashes so sailors can tell which one they see.",
    "The test suite runs on every change. A change whose tests fail is not merged, and the author is told which test failed and why.",
    "In winter the lake freezes from the edges inwards. By February the ice is thick enough to skate on, and by April it has melted again.",
    "The parcel was sent on Monday and arrived on Wednesday. It contained two books, a letter and a small box of tea.",
    "The orchestra tunes to the oboe. The oboe plays one note, and every other instrument adjusts until it plays the same note.",
    "A password should be long and hard to guess. It should not be written down near the computer, and it should not be used for more than one account.",
]

CODE = [
    ("def mean(values):\n    total = 0\n    for v in values:\n        total += v\n", "values"),
    ("def is_even(n):\n    return n % 2 == 0\n\n\ndef evens(numbers):\n", "numbers"),
    ("def read_lines(path):\n    with open(path) as f:\n", "path"),
    (
        "class Counter:\n    def __init__(self):\n        self.count = 0\n\n    def increment(self):\n",
        "count",
    ),
    ("def fibonacci(n):\n    a, b = 0, 1\n    for _ in range(n):\n", "n"),
    ("def word_counts(text):\n    counts = {}\n    for word in text.split():\n", "counts"),
    ("def clamp(value, low, high):\n    if value < low:\n        return low\n", "value"),
    ("def reverse_words(sentence):\n    words = sentence.split()\n", "words"),
    (
        "def merge_sorted(a, b):\n    out = []\n    i = j = 0\n    while i < len(a) and j < len(b):\n",
        "out",
    ),
    ("def chunks(items, size):\n    for start in range(0, len(items), size):\n", "items"),
]

PROSE_TASKS = [
    "Repeat the following text exactly, word for word.\n\n{p}",
    "Copy this passage, and then copy it once more.\n\n{p}",
    "Rewrite the passage below, keeping every sentence and changing only the punctuation.\n\n{p}",
    "Quote the passage below in full, then list its sentences one per line.\n\n{p}",
    "Here is a passage:\n\n{p}\n\nWrite it out again in the same words.",
    "Proofread the following text and return it with any mistakes corrected; if there are none, return it unchanged.\n\n{p}",
    "Turn the following text into a numbered list, one sentence per item, keeping each sentence as written.\n\n{p}",
    "Continue the text below: first restate it as it is, then add two sentences in the same style.\n\n{p}",
    "Put the following passage in quotation marks and repeat it twice.\n\n{p}",
    "Summarise the passage below by repeating its most important sentence word for word, then the rest of it.\n\n{p}",
]

CODE_TASKS = [
    "Complete the following Python function. Return the whole function, including the part given.\n\n```python\n{c}```",
    "Add a docstring to this Python code and return all of it otherwise unchanged.\n\n```python\n{c}```",
    "Add type hints to this Python code, return all of it, and keep the name `{v}`.\n\n```python\n{c}```",
    "Finish this Python code, then write it out again with comments on each line.\n\n```python\n{c}```",
]

#: Output tokens asked of each prompt: room to repeat a passage, where drafts are accepted.
OUTPUT_LEN = 128


def text() -> str:
    """The file's content: one ``{"prompt", "output_len"}`` a line (servebook's JSONL)."""
    rows = [t.format(p=p) for p in PROSE for t in PROSE_TASKS]
    rows += [t.format(c=c, v=v) for c, v in CODE for t in CODE_TASKS]
    return "".join(json.dumps({"prompt": r, "output_len": OUTPUT_LEN}) + "\n" for r in rows)


if __name__ == "__main__":
    with open(sys.argv[1], "w", encoding="utf-8") as f:
        f.write(text())
