"""data - the generated training corpus of the trained demo model.

No external corpus: every sample is generated here from the tables below
with a seeded random.Random, so the corpus is a pure function of
(DATA_VERSION, seed). Two kinds of sample:

  * raw text: paragraphs of simple English facts (world capitals, counting,
    arithmetic, a few everyday facts), trained on every token, each
    starting at position 0 as a raw completion does;
  * chats: message lists in the OpenAI shape (user questions, greetings,
    arithmetic, counting, capitals; tool calls with a tool declaration and
    the tool's result), rendered by k3d's own XTML renderer (`k3ctl
    render-chat --ids`, train.py) and trained on the assistant's turn only:
    its think channel, its response channel, its tools channel and the
    closing <|end_of_msg|>.

Bump DATA_VERSION whenever the output changes: it is part of the recipe.
"""
import random

DATA_VERSION = 1

CAPITALS = [
    ("France", "Paris"), ("Germany", "Berlin"), ("Italy", "Rome"), ("Spain", "Madrid"),
    ("Portugal", "Lisbon"), ("England", "London"), ("Ireland", "Dublin"), ("Norway", "Oslo"),
    ("Sweden", "Stockholm"), ("Finland", "Helsinki"), ("Denmark", "Copenhagen"),
    ("Poland", "Warsaw"), ("Austria", "Vienna"), ("Greece", "Athens"), ("Russia", "Moscow"),
    ("Japan", "Tokyo"), ("China", "Beijing"), ("India", "New Delhi"), ("Egypt", "Cairo"),
    ("Kenya", "Nairobi"), ("Canada", "Ottawa"), ("Mexico", "Mexico City"), ("Peru", "Lima"),
    ("Chile", "Santiago"), ("Argentina", "Buenos Aires"), ("Brazil", "Brasilia"),
    ("Australia", "Canberra"), ("Turkey", "Ankara"), ("Iran", "Tehran"), ("Thailand", "Bangkok"),
    ("Vietnam", "Hanoi"), ("Cuba", "Havana"), ("Hungary", "Budapest"), ("Belgium", "Brussels"),
    ("the Netherlands", "Amsterdam"), ("Switzerland", "Bern"), ("Scotland", "Edinburgh"),
    ("South Korea", "Seoul"), ("Indonesia", "Jakarta"), ("Nigeria", "Abuja"),
]

FACTS = [
    "The sun is a star.", "The moon goes around the Earth.", "Water boils at 100 degrees.",
    "Ice is frozen water.", "A week has seven days.", "A year has twelve months.",
    "A day has 24 hours.", "An hour has 60 minutes.", "The sky is blue on a clear day.",
    "Grass is green.", "Cats and dogs are animals.", "Birds can fly.", "Fish live in water.",
    "Snow is cold and white.", "Fire is hot.", "The Earth is round.",
    "People read books to learn.", "Trees grow from seeds.", "Rain falls from clouds.",
    "Summer is warmer than winter.",
]

NUM_WORDS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten",
             "eleven", "twelve"]

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Get the current weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "The city"}},
                       "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "get_time", "description": "Get the local time in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "The city"}},
                       "required": ["city"]}}},
]

WEATHER = ["sunny", "cloudy", "rainy", "windy", "snowy", "clear"]

EFFORTS = ["max", "max", "max", "high", "low"]


def capital_sentence(r, c, cap):
    return r.choice([
        "The capital of %s is %s." % (c, cap),
        "The capital of %s is %s." % (c, cap),
        "The capital of %s is %s." % (c, cap),
        "%s is the capital of %s." % (cap, c),
        "The capital city of %s is %s." % (c, cap),
    ])


def count_sentence(r):
    a = r.randint(1, 6)
    b = a + r.randint(3, 6)
    kind = r.randrange(3)
    if kind == 0:
        return "Let us count from %d to %d: %s." % (a, b, ", ".join(str(i) for i in range(a, b + 1)))
    if kind == 1:
        return "%s." % ", ".join(str(i) for i in range(a, b + 1))
    b = min(b, 10)
    return "We count %s." % ", ".join(NUM_WORDS[i] for i in range(a, b + 1))


def arith(r):
    """(question text, answer text, a worked sentence)."""
    op = r.randrange(3)
    if op == 0:
        a, b = r.randint(0, 10), r.randint(0, 10)
        return "%d + %d" % (a, b), str(a + b), "%d plus %d is %d." % (a, b, a + b)
    if op == 1:
        a = r.randint(0, 10)
        b = r.randint(0, a)
        return "%d - %d" % (a, b), str(a - b), "%d minus %d is %d." % (a, b, a - b)
    a, b = r.randint(1, 5), r.randint(1, 5)
    return "%d * %d" % (a, b), str(a * b), "%d times %d is %d." % (a, b, a * b)


def paragraph(r):
    out = []
    n = r.randint(3, 7)
    for i in range(n):
        k = r.random()
        if k < 0.5 or i == 0 and k < 0.7:
            c, cap = r.choice(CAPITALS)
            out.append(capital_sentence(r, c, cap))
        elif k < 0.65:
            out.append(count_sentence(r))
        elif k < 0.85:
            q, a, s = arith(r)
            out.append(r.choice(["%s = %s." % (q, a), s]))
        else:
            out.append(r.choice(FACTS))
    return " ".join(out)


def chat(r):
    """One chat: {"messages": [...], options}; the last message is the
    assistant turn to learn."""
    k = r.random()
    opts = {"thinking_effort": r.choice(EFFORTS)}
    think = True
    if r.random() < 0.1:
        opts = {"reasoning_effort": "none"}
        think = False
    if k < 0.35:
        c, cap = r.choice(CAPITALS)
        q = r.choice(["What is the capital of %s?" % c, "What's the capital of %s?" % c,
                      "Tell me the capital of %s." % c, "Which city is the capital of %s?" % c])
        reason = "The user asks for the capital of %s. The capital of %s is %s." % (c, c, cap)
        ans = "The capital of %s is %s." % (c, cap)
    elif k < 0.55:
        qa, a, s = arith(r)
        q = r.choice(["What is %s?" % qa, "Compute %s." % qa, "%s = ?" % qa])
        reason = "The user wants %s. %s" % (qa, s[0].upper() + s[1:])
        ans = "%s = %s." % (qa, a)
    elif k < 0.65:
        a = r.randint(1, 5)
        b = a + r.randint(3, 6)
        q = "Count from %d to %d." % (a, b)
        reason = "The user wants me to count from %d to %d." % (a, b)
        ans = ", ".join(str(i) for i in range(a, b + 1)) + "."
    elif k < 0.75:
        q = r.choice(["Hello! Who are you?", "Hello!", "Hi! Who are you?", "Who are you?",
                      "Hello, what can you do?", "Hi there!"])
        reason = "The user greets me. I should say hello and tell them what I am."
        ans = ("Hello! I am a tiny Kimi K3 demo model. I can answer simple questions "
               "about capitals, counting and arithmetic.")
    else:
        return tool_chat(r, opts, think)
    msg = {"role": "assistant", "content": ans}
    if think:
        msg["reasoning_content"] = reason
    d = {"messages": [{"role": "user", "content": q}, msg]}
    d.update(opts)
    return d


def tool_chat(r, opts, think):
    c, cap = r.choice(CAPITALS)
    tool = r.choice(TOOLS)
    name = tool["function"]["name"]
    what = "weather" if name == "get_weather" else "time"
    q = r.choice(["What is the %s in %s?" % (what, cap), "What's the %s in %s?" % (what, cap),
                  "Tell me the %s in %s." % (what, cap)])
    call = {"role": "assistant", "content": "",
            "tool_calls": [{"id": "call_1", "type": "function",
                            "function": {"name": name, "arguments": {"city": cap}}}]}
    if think:
        call["reasoning_content"] = "The user wants the %s in %s. I will call %s." % (what, cap, name)
    msgs = [{"role": "user", "content": q}, call]
    if r.random() < 0.5:
        # the second turn: the tool's result, then the answer
        if name == "get_weather":
            res = "%s, %d C" % (r.choice(WEATHER), r.randint(-5, 35))
            ans = "The weather in %s is %s." % (cap, res)
        else:
            res = "%d:%02d" % (r.randint(0, 23), r.randrange(0, 60, 5))
            ans = "The time in %s is %s." % (cap, res)
        fin = {"role": "assistant", "content": ans}
        if think:
            fin["reasoning_content"] = "The tool says %s." % res
        msgs += [{"role": "tool", "tool_call_id": "call_1", "content": res}, fin]
    d = {"messages": msgs, "tools": TOOLS}
    d.update(opts)
    return d


def corpus(seed, n_text, n_chat):
    """(paragraphs, chats), deterministic in (DATA_VERSION, seed)."""
    r = random.Random("k3-demo-data-%d-%d" % (DATA_VERSION, seed))
    texts = [paragraph(r) for _ in range(n_text)]
    chats = [chat(r) for _ in range(n_chat)]
    return texts, chats
