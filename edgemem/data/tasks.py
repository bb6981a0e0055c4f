"""Long-context tasks built from the prepared corpora, seeded and deterministic.

Every item is a long context, a question about it, the gold answer(s) and the passage that holds
the answer (what the `oracle` method sees). Lengths are counted in the model's tokens, context and
question together, and land within 2% of their bin.

- `niah`: RULER's single needle ("One of the special magic numbers for <key> is: <7 digits>.") at a
  controlled depth of real prose; `niah-mk` adds three distractor needles with other keys;
  `niah-mv` hides four values for one key, all of which must be returned.
- `vt`: RULER's variable tracking: a chain `VAR A = 12345`, `VAR B = VAR A`, ... spread through the
  haystack with a distractor chain; all the chain's names must be returned.
- `docqa`: real paragraphs concatenated into a long document; each question quotes the start of
  one sentence of one paragraph and asks what comes next; the answer is the next word, chosen to
  occur once in the whole context (so only that passage answers it). A fill-in-the-blank cloze
  was tried first: SmolLM2-135M scored 0/5 on it even given the passage alone (the oracle).
- `types`: a masked parameter annotation in real typed Python (sqlalchemy, pandas, mypy; the
  standard library labelled from typeshed), the file at a controlled depth inside the joined
  package; items whose parameter name gives the type away are dropped.

The evaluation's items come from the test split only. Training draws items of the same tasks from
the train split (`Builder(..., split="train")`): other documents, other seeds, and haystacks that
start at a random place in the text instead of its beginning.
"""

from __future__ import annotations

import ast
import hashlib
import random
import re
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

from edgemem.data import corpora
from edgemem.errors import EdgememError

LENGTHS = (1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072)
TASKS = ("niah", "niah-mk", "niah-mv", "vt", "docqa", "types")
PROSE = ("linux-doc", "python-doc", "gnu-manuals")
CODE = ("sqlalchemy", "pandas", "mypy", "stdlib")
TOLERANCE = 0.02


@dataclass
class Item:
    task: str
    length: int  # the bin, in tokens
    index: int
    context: str
    question: str
    answers: list[str]  # all must be found (niah-mv, vt), or the one gold answer
    passage: str  # the evidence alone: what the oracle sees
    answer_prefix: str = ""  # starts the assistant's turn, as RULER does
    tokens: int = 0  # context + question, in the model's tokens
    meta: dict = field(default_factory=dict)

    @property
    def id(self) -> str:
        return f"{self.task}-{self.length}-{self.index}"

    def to_json(self) -> dict:
        return {"id": self.id, **asdict(self)}


def item_depth(index: int) -> float:
    """Depth (0..1) of item `index`: the golden-ratio sequence, evenly spread for any number of items
    and independent of it, so a sweep extended from n to 2n items keeps its first n."""
    return 0.0 if index == 0 else (index * 0.6180339887498949) % 1.0


def _rng(*parts: object) -> random.Random:
    return random.Random(int(hashlib.sha256("|".join(map(str, parts)).encode()).hexdigest()[:16], 16))


# Keys for needles: adjective-noun pairs, far from the documentation's own vocabulary.
_ADJ = (  # noqa: SIM905
    "amber azure brave calm crimson dusty eager fancy gentle golden hollow icy jolly lively "
    "misty noble olive proud quiet rapid rusty silent sunny tidy velvet witty young zesty"
).split()
_NOUN = (  # noqa: SIM905
    "badger canyon dolphin falcon glacier harbor island jaguar kettle lantern meadow nectar "
    "orchard pebble quartz raven saddle tulip umbrella violin walrus yacht zephyr bison cobra"
).split()


# The niah needle, question and answer prefix (single value); training's recall items use them too.
NIAH_NEEDLE = "One of the special magic numbers for {} is: {}."
NIAH_QUESTION = "What is the special magic number for {} mentioned in the provided text?"
NIAH_PREFIX = "The special magic number for {} mentioned in the provided text is"


def random_key(rng: random.Random, taken: set[str]) -> str:
    while True:
        key = f"{rng.choice(_ADJ)}-{rng.choice(_NOUN)}"
        if key not in taken:
            taken.add(key)
            return key


def random_number(rng: random.Random, digits: int = 7) -> str:
    return str(rng.randrange(10 ** (digits - 1), 10**digits))


class Builder:
    """Builds items for one tokenizer; haystack text is read from the prepared corpora once."""

    def __init__(
        self,
        tokenizer: object,
        root: Path | None = None,
        prose: tuple[str, ...] = PROSE,
        code: tuple[str, ...] = CODE,
        split: str = "test",
    ) -> None:
        if split not in ("train", "validation", "test"):
            raise EdgememError(f"unknown split {split!r}: choose train, validation or test")
        self.tokenizer = tokenizer
        self.root = root
        self.split = split
        self.prose_sources, self.code_sources = prose, code
        self._prose: str | None = None
        self._paragraphs: list[str] | None = None
        self._code: dict[str, list[dict]] | None = None
        self._cands: list[dict] | None = None

    # --- tokens ---

    def count(self, text: str) -> int:
        return len(self.tokenizer(text, add_special_tokens=False).input_ids)  # type: ignore[operator]

    def cut(self, text: str, tokens: int) -> str:
        """The longest prefix of `text` with at most `tokens` tokens, cut at a token boundary."""
        if len(text) > 12 * tokens + 1000:  # no token is longer than 12 characters on average
            text = text[: 12 * tokens + 1000]
        enc = self.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)  # type: ignore[operator]
        if len(enc.input_ids) <= tokens:
            return text
        return text[: enc.offset_mapping[tokens][0]]

    # --- seeds and sources (the builder's split only) ---

    def _rng(self, *parts: object) -> random.Random:
        """The seed of one decision. The test split keeps the evaluation's seeds; other splits add
        their name, so a training item never repeats a test item's keys and numbers."""
        return _rng(*parts) if self.split == "test" else _rng(self.split, *parts)

    def _offset(self, rng: random.Random, length: int) -> int:
        """Where a haystack starts in the prose: 0 for the test split (the evaluation's items), a
        random paragraph start otherwise (every training item its own text)."""
        if self.split == "test":
            return 0
        prose = self.prose()
        start = rng.randrange(max(1, len(prose) - 12 * length - 1000))
        found = prose.find("\n\n", start)
        return found + 2 if 0 <= found < len(prose) - 12 * length else start

    def prose(self) -> str:
        """The prose haystack: the split's documents of all prose corpora, in a fixed shuffled order."""
        if self._prose is None:
            docs = [r for name in self.prose_sources for r in corpora.load(name, self.split, self.root)]
            docs.sort(key=lambda r: r["sha256"])
            _rng("haystack").shuffle(docs)
            self._prose = "\n\n".join(r["text"].strip() for r in docs)
        return self._prose

    def paragraphs(self) -> list[str]:
        """Prose paragraphs of 200-1200 characters that read as text (not tables, code or markup)."""
        if self._paragraphs is None:
            out = []
            for block in re.split(r"\n\s*\n", self.prose()):
                block = block.strip()
                letters = sum(c.isalpha() or c == " " for c in block)
                if 200 <= len(block) <= 1200 and letters > 0.85 * len(block) and ". " in block:
                    out.append(block)
            self._paragraphs = out
        return self._paragraphs

    def code(self) -> dict[str, list[dict]]:
        if self._code is None:
            self._code = {name: list(corpora.load(name, self.split, self.root)) for name in self.code_sources}
        return self._code

    # --- assembling a context of a given length ---

    def _haystack_with(self, needles: list[tuple[float, str]], budget: int, offset: int = 0) -> str:
        """Real prose of `budget` tokens with each needle sentence inserted at its depth (0..1),
        snapped back to the nearest sentence or line end."""
        text = self.cut(self.prose()[offset:], budget)
        cuts = []
        for depth, needle in sorted(needles):
            pos = int(depth * len(text))
            window = text[max(0, pos - 400) : pos]
            ends = [m.end() for m in re.finditer(r"[.!?]\s|\n", window)]
            pos = max(0, pos - len(window) + ends[-1]) if ends else pos
            cuts.append((pos, needle))
        parts, last = [], 0
        for pos, needle in cuts:
            parts += [text[last:pos], f" {needle} " if pos else f"{needle} "]
            last = pos
        parts.append(text[last:])
        return "".join(parts)

    def _fit(self, make, length: int) -> tuple[str, int]:
        """Call make(budget) -> context until context + question land within 2% of `length`."""
        budget = length
        for _ in range(6):
            context, question = make(budget)
            total = self.count(context) + self.count(question)
            if abs(total - length) <= TOLERANCE * length * 0.5:
                return context, total
            budget += length - total
        if abs(total - length) > TOLERANCE * length:
            raise EdgememError(f"could not fit a context to {length} tokens (got {total})")
        return context, total

    # --- tasks ---

    def niah(self, length: int, index: int, n: int, variant: str = "single") -> Item:
        rng = self._rng("niah", variant, length, index)
        depth = item_depth(index)
        taken: set[str] = set()
        key = random_key(rng, taken)
        template = NIAH_NEEDLE
        if variant == "mv":
            values = [random_number(rng) for _ in range(4)]
            depths = sorted([depth] + [rng.random() for _ in range(3)])
            needles = [(d, template.format(key, v)) for d, v in zip(depths, values, strict=True)]
            question = f"What are all the special magic numbers for {key} mentioned in the provided text?"
            prefix = f"The special magic numbers for {key} mentioned in the provided text are"
        else:
            values = [random_number(rng)]
            needles = [(depth, template.format(key, values[0]))]
            if variant == "mk":
                needles += [
                    (rng.random(), template.format(random_key(rng, taken), random_number(rng)))
                    for _ in range(3)
                ]
            question, prefix = NIAH_QUESTION.format(key), NIAH_PREFIX.format(key)
        offset = self._offset(rng, length)
        context, tokens = self._fit(
            lambda b: (self._haystack_with(needles, b - 40 * len(needles), offset), question), length
        )
        task = {"single": "niah", "mk": "niah-mk", "mv": "niah-mv"}[variant]
        passage = " ".join(s for _, s in sorted(needles) if key in s)
        meta = {"depth": round(depth, 4), "key": key}
        return Item(task, length, index, context, question, values, passage, prefix, tokens, meta)

    def vt(self, length: int, index: int, n: int, hops: int = 4) -> Item:
        rng = self._rng("vt", length, index)
        names: set[str] = set()

        def name() -> str:
            while (v := "".join(rng.choice("ABCDEFGHIJKLMNOPQRSTUVWXYZ") for _ in range(5))) in names:
                pass
            names.add(v)
            return v

        value, other = random_number(rng, 5), random_number(rng, 5)
        chain = [name() for _ in range(hops + 1)]
        decoy = [name() for _ in range(hops + 1)]
        start = item_depth(index) * 0.5  # the first assignment's depth; the chain spans half the text
        needles = []
        for vars_, val, first in ((chain, value, start), (decoy, other, rng.random() * 0.5)):
            statements = [f"VAR {vars_[0]} = {val}."] + [
                f"VAR {b} = VAR {a}." for a, b in zip(vars_, vars_[1:], strict=False)
            ]
            needles += [(first + k * 0.5 / hops, s) for k, s in enumerate(statements)]
        question = f"Find all variables that are assigned the value {value} in the text above."
        prefix = (
            "According to the chain(s) of variable assignment in the text above, "
            f"{hops + 1} variables are assigned the value {value}, they are:"
        )
        offset = self._offset(rng, length)
        context, tokens = self._fit(
            lambda b: (self._haystack_with(needles, b - 12 * len(needles), offset), question), length
        )
        passage = " ".join(s for _, s in sorted(needles) if any(f" {v} " in f"{s} " for v in chain))
        meta = {"depth": round(start, 4)}
        return Item("vt", length, index, context, question, chain, passage, prefix, tokens, meta)

    def docqa(self, length: int, index: int, n: int, group_size: int = 25) -> Item:
        """Items of one group share one long document (a user asks many questions about one file);
        each asks about a different paragraph, at depths spread over the document."""
        group = index // group_size
        rng = self._rng("docqa", length, group)
        paras = self.paragraphs()
        order = rng.sample(range(len(paras)), len(paras))

        def make(budget: int) -> tuple[str, str]:
            chosen, used = [], 0
            for k in order:
                if used > budget * 5:  # characters; a token is 3-4 of them
                    break
                chosen.append(k)
                used += len(paras[k])
            return self.cut("\n\n".join(paras[k] for k in chosen), budget - 60), _QUOTE_Q.format(
                quote="_" * 40
            )

        context, _ = self._fit(make, length)
        blocks = context.split("\n\n")[:-1]  # the last paragraph may be cut: never a target
        target = min(len(blocks) - 1, round(item_depth(index) * (len(blocks) - 1)))
        counts: dict[str, int] = {}
        for word in re.findall(r"[A-Za-z]+", context.lower()):
            counts[word] = counts.get(word, 0) + 1
        # the nearest paragraph to the target depth that has a sentence with a word found once
        for offset in range(len(blocks)):
            for k in (target - offset, target + offset):
                if 0 <= k < len(blocks) and (
                    found := _continuation(blocks[k], counts, self._rng("cloze", length, index))
                ):
                    quote, word = found
                    question = _QUOTE_Q.format(quote=quote)
                    context = self.cut(
                        context, length - self.count(question)
                    )  # only the cut last paragraph shrinks
                    if blocks[k] not in context:
                        continue
                    tokens = self.count(context) + self.count(question)
                    meta = {"depth": round(k / max(1, len(blocks) - 1), 4), "group": group}
                    prefix = f"The text says: {quote}"
                    return Item(
                        "docqa", length, index, context, question, [word], blocks[k], prefix, tokens, meta
                    )
        raise EdgememError(f"no quotable sentence found for docqa item {length}/{index}")

    def types(self, length: int, index: int, n: int) -> Item:
        rng = self._rng("types", length, index)
        candidates = self._type_candidates()
        if not candidates:
            raise EdgememError(f"no type annotations found in the {self.split}-split code")
        for _attempt in range(50):
            cand = candidates[rng.randrange(len(candidates))]
            file_text = masked(cand)
            lines = file_text.splitlines(keepends=True)
            focus = cand["line"]  # the masked line, counted in the lines of file_text
            if self.count(file_text) > length * 0.9:  # a window of the file around the function
                lo, hi = max(0, focus - 40), min(len(lines), focus + 20)
                file_text, lines, focus = "".join(lines[lo:hi]), lines[lo:hi], focus - lo
                if self.count(file_text) > length * 0.9:
                    continue
            depth = item_depth(index)
            item = self._types_item(cand, file_text, sum(map(len, lines[:focus])), length, index, depth)
            if item is not None:
                return item
        raise EdgememError(f"no types item fits {length} tokens")

    def _types_item(
        self, cand: dict, file_text: str, focus: int, length: int, index: int, depth: float
    ) -> Item | None:
        """`focus`: where the masked line starts in `file_text` (characters)."""
        others = [r for r in self.code()[cand["source"]] if r["name"] != cand["file"]]
        others.sort(key=lambda r: r["name"])
        header = f"# ===== {cand['file']} =====\n"
        target = header + file_text
        question = (
            f"In the code above, the annotation of parameter `{cand['param']}` of `{cand['function']}` "
            f"in {cand['file']} was removed. What is its type annotation?"
        )

        def make(budget: int) -> tuple[str, str]:
            room = max(0, budget - self.count(target) - self.count(question))
            before_budget, after_budget = int(room * depth), room - int(room * depth)
            before = self._join_code(others, before_budget, rng_key=("b", length, index), tail=True)
            after = self._join_code(others, after_budget, rng_key=("a", length, index), tail=False)
            return before + target + after, question

        try:
            context, tokens = self._fit(make, length)
        except EdgememError:
            return None
        meta = {
            "depth": round(depth, 4),
            "file": cand["file"],
            "source": cand["source"],
            "focus": len(header) + focus,  # the masked line in the passage: an oracle that must cut keeps it
        }
        prefix = "The type annotation is `"
        passage = target
        return Item("types", length, index, context, question, [cand["type"]], passage, prefix, tokens, meta)

    def _join_code(self, files: list[dict], budget: int, rng_key: tuple, tail: bool) -> str:
        """Other files of the same package, joined with path headers, `budget` tokens of them."""
        if budget <= 0:
            return ""
        rng = self._rng("code", *rng_key)
        picked, used = [], 0
        for r in rng.sample(files, len(files)):
            text = f"# ===== {r['name']} =====\n{r['text']}\n"
            picked.append(text)
            used += len(text) // 3
            if used > budget * 1.3:
                break
        joined = "".join(picked)
        if tail:  # keep the end, so the target file follows a whole line
            enc = self.tokenizer(joined, add_special_tokens=False, return_offsets_mapping=True)  # type: ignore[operator]
            ids = enc.input_ids
            if len(ids) > budget:
                start = enc.offset_mapping[len(ids) - budget][0]
                nl = joined.find("\n", start)
                joined = joined[nl + 1 :] if nl >= 0 else joined[start:]
            return joined
        text = self.cut(joined, budget)
        return text[: text.rfind("\n") + 1] if "\n" in text else text

    def _type_candidates(self) -> list[dict]:
        if self._cands is None:
            out = []
            for source, rows in self.code().items():
                stubs = corpora.load_stubs(self.root) if source == "stdlib" else None
                for row in rows:
                    out += annotated_params(row["text"], row["name"], source, stubs)
            self._cands = out
        return self._cands

    def item(self, task: str, length: int, index: int, n: int) -> Item:
        """Item `index` of a bin of `n` (`n` only bounds the index: items do not depend on it)."""
        if task not in TASKS:
            raise EdgememError(f"unknown task {task!r}: choose from {', '.join(TASKS)}")
        if not 0 <= index < n:
            raise EdgememError(f"item index {index} is outside 0..{n - 1}")
        if task.startswith("niah"):
            return self.niah(length, index, n, {"niah": "single", "niah-mk": "mk", "niah-mv": "mv"}[task])
        return {"vt": self.vt, "docqa": self.docqa, "types": self.types}[task](length, index, n)

    def sources(self, task: str) -> tuple[str, ...]:
        """The corpora a task's items are cut from: code for `types`, prose for the others."""
        return self.code_sources if task == "types" else self.prose_sources

    def corpora_id(self, task: str) -> str:
        """`corpora.version_id` of the task's sources: recorded with every evaluated item."""
        return corpora.version_id(self.sources(task), self.root)

    def build(self, task: str, length: int, n: int) -> Iterator[Item]:
        for index in range(n):
            yield self.item(task, length, index, n)


_QUOTE_Q = 'Quote the text above: what comes after "{quote}"?'


def _continuation(paragraph: str, counts: dict[str, int], rng: random.Random) -> tuple[str, str] | None:
    """(the start of a sentence of the paragraph, its next word): the word has 5+ letters and occurs
    once in the whole context, and at least 5 words come before it."""
    sentences = [
        s.strip()
        for s in re.split(r"(?<=[.!?])\s+", paragraph)
        if 8 <= len(s.split()) <= 40 and not re.search(r"::|[`*|<>_=]|^\.\.", s.strip())
    ]
    rng.shuffle(sentences)
    for sentence in sentences:
        words = sentence.split()
        cuts = [
            j
            for j in range(5, len(words))
            if re.fullmatch(r"[A-Za-z]{5,}[.,;:!?]?", words[j])
            and counts.get(words[j].rstrip(".,;:!?").lower()) == 1
        ]
        if cuts:
            j = rng.choice(cuts)
            return " ".join(words[:j]), words[j].rstrip(".,;:!?")
    return None


# --- types: finding annotated parameters ---------------------------------------------------------


def masked(cand: dict) -> str:
    """The candidate's file with the annotation removed."""
    if cand["new_line"] is None:
        return cand["text"]
    lines = cand["text"].splitlines(keepends=True)
    lines[cand["line"]] = cand["new_line"]
    return "".join(lines)


_GIVEAWAY = {"name": "str", "path": "str", "text": "str", "count": "int", "flag": "bool", "msg": "str"}


def gives_type_away(param: str, annotation: str) -> bool:
    """A parameter whose name alone tells its type (`session: Session`, `name: str`, `is_x: bool`)."""
    p = param.lower().replace("_", "")
    words = [w.lower() for w in re.findall(r"[A-Za-z]+", annotation)]
    if any(len(w) >= 3 and (w in p or (len(p) >= 3 and p in w)) for w in words):
        return True
    if param.startswith(("is_", "has_", "use_", "allow_")) and annotation == "bool":
        return True
    return _GIVEAWAY.get(param.lower()) == annotation


def normalize_type(text: str) -> str:
    """A canonical spelling of a type annotation: `Optional[List[int]]` == `list[int] | None`."""
    text = text.strip().strip("`'\" ").rstrip(".").strip()
    try:
        node = ast.parse(text, mode="eval").body
    except SyntaxError:
        return re.sub(r"\s+", "", text)
    return _canon(node)


_ALIASES = {
    "List": "list",
    "Dict": "dict",
    "Tuple": "tuple",
    "Set": "set",
    "FrozenSet": "frozenset",
    "Type": "type",
}


def _canon(node: ast.expr) -> str:
    if isinstance(node, ast.Constant):
        return (
            "None"
            if node.value is None
            else (node.value if isinstance(node.value, str) else repr(node.value))
        )
    if isinstance(node, ast.Name):
        return _ALIASES.get(node.id, node.id)
    if isinstance(node, ast.Attribute):
        if isinstance(node.value, ast.Name) and node.value.id in ("typing", "t", "typing_extensions", "abc"):
            return _ALIASES.get(node.attr, node.attr)
        return f"{_canon(node.value)}.{node.attr}"
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        return "|".join(sorted(set(_union_members(node))))
    if isinstance(node, ast.Subscript):
        base = _canon(node.value)
        args = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        if base == "Optional":
            return "|".join(sorted({*_union_members(args[0]), "None"}))
        if base == "Union":
            return "|".join(sorted({m for a in args for m in _union_members(a)}))
        return f"{base}[{','.join(_canon(a) for a in args)}]"
    if isinstance(node, ast.List):
        return f"[{','.join(_canon(e) for e in node.elts)}]"
    if isinstance(node, ast.Tuple):
        return ",".join(_canon(e) for e in node.elts)
    return ast.unparse(node).replace(" ", "")


def _union_members(node: ast.expr) -> list[str]:
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        return _union_members(node.left) + _union_members(node.right)
    canon = _canon(node)
    return canon.split("|")


def _skip_annotation(annotation: str) -> bool:
    return (
        len(annotation) > 60
        or any(bad in annotation for bad in ("Incomplete", "Unused", "Any", "_T", "Self", "..."))
        or bool(re.search(r"(^|[^\w.])_", annotation))  # private aliases and type variables
    )


def _functions(tree: ast.AST) -> Iterator[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    for node in getattr(tree, "body", []):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            yield node.name, node
        elif isinstance(node, ast.ClassDef):
            for sub in node.body:
                if isinstance(sub, ast.FunctionDef | ast.AsyncFunctionDef):
                    yield f"{node.name}.{sub.name}", sub


def _params(func: ast.FunctionDef | ast.AsyncFunctionDef) -> list[ast.arg]:
    a = func.args
    return [p for p in a.posonlyargs + a.args + a.kwonlyargs if p.arg not in ("self", "cls")]


_AST_LINES = re.compile(r".*?(?:\r\n|\n|\r)|.+$", re.S)


def annotated_params(text: str, file: str, source: str, stubs: dict[str, str] | None = None) -> list[dict]:
    """Type-annotation items in one file: the file with one annotation removed, and the gold type.

    With `stubs` (the standard library), the source is unannotated and the gold comes from the
    typeshed stub of the same function and parameter."""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return []
    lines = text.splitlines(keepends=True)
    source_lines = _AST_LINES.findall(text)  # numbered as ast numbers them: a form feed ends no line
    stub_types: dict[tuple[str, str], str] = {}
    if stubs is not None:
        module = file.split("/", 1)[1].removesuffix(".py").removesuffix("/__init__")
        stub = stubs.get(module)
        if stub is None:
            return []
        try:
            stub_tree = ast.parse(stub)
        except SyntaxError:
            return []
        for qual, func in _functions(stub_tree):
            for p in _params(func):
                if p.annotation is not None:
                    stub_types[(qual, p.arg)] = ast.unparse(p.annotation)
    out = []
    for qual, func in _functions(tree):
        for p in _params(func):
            if stubs is not None:
                if p.annotation is not None or (qual, p.arg) not in stub_types:
                    continue
                annotation, new_line = stub_types[(qual, p.arg)], None
            else:
                if p.annotation is None:
                    continue
                if not p.lineno == p.annotation.lineno == p.annotation.end_lineno:
                    continue
                # ast.get_source_segment, without re-splitting the whole file for each annotation
                # (quadratic: 9 minutes for the train split's 18k candidates)
                source_line = source_lines[p.lineno - 1].encode()
                annotation = source_line[p.annotation.col_offset : p.annotation.end_col_offset].decode()
                line = lines[p.lineno - 1]
                name_end = p.col_offset + len(p.arg)
                new_line = line[:name_end] + line[p.annotation.end_col_offset :]
            owner = qual.split(".")[0] if "." in qual else ""
            if (
                _skip_annotation(annotation)
                or gives_type_away(p.arg, annotation)
                or owner in annotation.split(".")
            ):
                continue
            out.append(
                {
                    "source": source,
                    "file": file,
                    "function": qual,
                    "param": p.arg,
                    "type": annotation,
                    "line": p.lineno - 1,
                    "new_line": new_line,  # the line without the annotation (None: already bare)
                    "text": text,  # the same string object as the corpus row: no copy
                }
            )
    return out
