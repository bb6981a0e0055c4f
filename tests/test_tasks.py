"""Task generators and scoring, on real text (the system's license texts, real Python source) and
the real SmolLM2 tokenizer (read from its GGUF file: no weights are loaded)."""

import ast
import json
import re
import sysconfig
from pathlib import Path

import pytest

from edgemem.data import tasks
from edgemem.data.tasks import Builder, gives_type_away, normalize_type
from edgemem.errors import EdgememError
from edgemem.models import load_tokenizer
from edgemem.scoring import near_miss, score, type_answer

LICENSES = Path("/usr/share/common-licenses")
EDGEMEM_SRC = Path(tasks.__file__).parents[1]

# A few signatures from typeshed's stdlib/shlex.pyi, to label the unannotated stdlib source.
SHLEX_STUB = """
from collections.abc import Iterable
def split(s: str | None, comments: bool = False, posix: bool = True) -> list[str]: ...
def join(split_command: Iterable[str]) -> str: ...
def quote(s: str) -> str: ...
class shlex:
    def push_token(self, tok: str) -> None: ...
    def read_token(self) -> str | None: ...
"""


def _write(root: Path, source: str, rows: list[dict]) -> None:
    with open(root / f"{source}.jsonl", "w") as handle:
        for row in rows:
            handle.write(json.dumps({"split": "test", "sha256": "-", **row}) + "\n")


@pytest.fixture(scope="module")
def builder(tmp_path_factory):
    root = tmp_path_factory.mktemp("corpora")
    prose = [
        {"name": p.name, "kind": "prose", "text": p.read_text(errors="replace")}
        for p in sorted(LICENSES.iterdir())
        if p.is_file() and p.stat().st_size > 5000
    ]
    _write(root, "linux-doc", prose)
    code = [
        {"name": f"edgemem/{p.name}", "kind": "code", "text": p.read_text()}
        for p in sorted(EDGEMEM_SRC.glob("*.py"))
    ]
    _write(root, "sqlalchemy", code)
    shlex_src = (Path(sysconfig.get_paths()["stdlib"]) / "shlex.py").read_text()
    _write(root, "stdlib", [{"name": "stdlib/shlex.py", "kind": "code", "text": shlex_src}])
    (root / "stdlib-stubs.jsonl").write_text(json.dumps({"module": "shlex", "text": SHLEX_STUB}) + "\n")
    return Builder(load_tokenizer(), root, prose=("linux-doc",), code=("sqlalchemy", "stdlib"))


def _one(builder, task, length, index, n):
    return builder.item(task, length, index, n)


@pytest.mark.parametrize("task", tasks.TASKS)
def test_generators_are_deterministic_for_a_seed(builder, task):
    fresh = Builder(builder.tokenizer, builder.root, builder.prose_sources, builder.code_sources)
    a, b = _one(builder, task, 1024, 3, 10), _one(fresh, task, 1024, 3, 10)
    assert a.to_json() == b.to_json()
    assert _one(builder, task, 1024, 4, 10).to_json() != a.to_json()


@pytest.mark.parametrize("task", tasks.TASKS)
@pytest.mark.parametrize("length", [1024, 4096])
def test_length_bins_hit_their_token_counts_within_2_percent(builder, task, length):
    item = _one(builder, task, length, 2, 10)
    counted = builder.count(item.context) + builder.count(item.question)
    assert counted == item.tokens
    assert abs(item.tokens - length) <= 0.02 * length, item.tokens


def test_item_depths_do_not_depend_on_the_number_of_items(builder):
    assert _one(builder, "niah", 1024, 3, 5).to_json() == _one(builder, "niah", 1024, 3, 50).to_json()
    depths = [tasks.item_depth(i) for i in range(20)]
    assert min(depths) == 0.0 and max(depths) > 0.9 and len(set(depths)) == 20


@pytest.mark.parametrize("index", [0, 1, 2, 3, 5, 8])
def test_needle_lands_at_the_asked_depth_and_its_value_is_in_the_text(builder, index):
    item = _one(builder, "niah", 4096, index, 10)
    needle = f"One of the special magic numbers for {item.meta['key']} is: {item.answers[0]}."
    assert item.context.count(needle) == 1
    position = item.context.index(needle) / len(item.context)
    assert abs(position - item.meta["depth"]) < 0.04


def test_multikey_and_multivalue_needles_keep_their_gold_recoverable(builder):
    mk = _one(builder, "niah-mk", 2048, 2, 10)
    assert len(re.findall(r"special magic numbers for ([a-z]+-[a-z]+) is", mk.context)) == 4
    assert f"for {mk.meta['key']} is: {mk.answers[0]}." in mk.context
    mv = _one(builder, "niah-mv", 2048, 2, 10)
    assert len(mv.answers) == 4
    assert all(f"for {mv.meta['key']} is: {v}." in mv.context for v in mv.answers)


def test_variable_chain_is_in_the_text_in_order(builder):
    item = _one(builder, "vt", 4096, 1, 10)
    value = re.search(r"value (\d+)", item.question).group(1)
    chain = item.answers
    positions = [item.context.index(f"VAR {chain[0]} = {value}.")]
    positions += [item.context.index(f"VAR {b} = VAR {a}.") for a, b in zip(chain, chain[1:], strict=False)]
    assert positions == sorted(positions)


def test_docqa_quote_continues_with_the_gold_word_from_one_passage(builder):
    for index in range(4):
        item = _one(builder, "docqa", 2048, index, 10)
        quote = re.search(r'what comes after "(.*)"\?$', item.question).group(1)
        assert item.answer_prefix == f"The text says: {quote}"
        filled = f"{quote} {item.answers[0]}"
        assert len(quote.split()) >= 5
        assert filled in " ".join(item.context.split())
        assert filled in " ".join(item.passage.split())
        assert len(re.findall(rf"\b{item.answers[0].lower()}\b", item.context.lower())) == 1


def test_types_item_masks_a_real_annotation(builder):
    for index in range(3):
        item = _one(builder, "types", 2048, index, 10)
        source = {r["name"]: r["text"] for r in builder.code()[item.meta["source"]]}[item.meta["file"]]
        param = re.search(r"parameter `(\w+)`", item.question).group(1)
        if item.meta["source"] == "stdlib":
            assert re.search(rf"\b{param}\b", item.context)
        else:
            assert f"{param}: {item.answers[0]}" in source
        assert not gives_type_away(param, item.answers[0])


def test_types_items_say_where_the_masked_line_sits_in_their_passage(builder):
    """meta["focus"] is the masked line's offset in the passage (also when the file was cut to a
    window around it): the oracle keeps that line when the passage must be cut to fit."""
    for length in (1024, 2048):
        for index in range(3):
            item = _one(builder, "types", length, index, 10)
            param = re.search(r"parameter `(\w+)`", item.question).group(1)
            line = item.passage[item.meta["focus"] :].splitlines()[0]
            # the masked parameter's annotation is gone (another parameter may share its type)
            assert re.search(rf"\b{param}\b", line) and f"{param}: {item.answers[0]}" not in line, line


def test_stdlib_parameters_are_labelled_from_their_stub(builder):
    stdlib = [c for c in builder._type_candidates() if c["source"] == "stdlib"]
    found = {(c["function"], c["param"]): c["type"] for c in stdlib}
    assert found[("split", "comments")] == "bool"
    assert found[("split", "s")] == "str | None"
    assert ("shlex.push_token", "tok") in found


def test_annotations_are_read_exactly_as_ast_reads_them_on_awkward_files():
    # non-ASCII before the annotation (ast's columns are UTF-8 bytes), CRLF, a lone CR and a form
    # feed (which ends a line for str.splitlines but not for ast)
    text = (
        "import typing\r\n\x0c\n"
        "def f(\u00e9l\u00e8ve: typing.Optional[int], limit: dict[str, float] = None) -> None:\r"
        "    pass\n"
        "class K:\n    def g(self, when: 'datetime.date', *, depth: int | None) -> None: ...\n"
    )
    tree = ast.parse(text)
    want = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.arg) and node.annotation is not None:
            want[node.arg] = ast.get_source_segment(text, node.annotation)
    found = {c["param"]: c["type"] for c in tasks.annotated_params(text, "m.py", "sqlalchemy")}
    assert found and found == {k: v for k, v in want.items() if k in found}
    assert set(found) == {"\u00e9l\u00e8ve", "limit", "when", "depth"}


def test_a_train_split_builder_reads_only_train_documents_with_other_seeds(tmp_path):
    docs = sorted(p for p in LICENSES.iterdir() if p.is_file() and p.stat().st_size > 5000)
    with open(tmp_path / "linux-doc.jsonl", "w") as handle:
        for k, p in enumerate(docs):
            # every paragraph names its document, so a haystack shows where its text came from
            text = p.read_text(errors="replace").replace("\n\n", f"\n\nzq{k}x ")
            split = "test" if k % 2 else "train"
            row = {"name": p.name, "kind": "prose", "split": split, "sha256": "-", "text": text}
            handle.write(json.dumps(row) + "\n")
    test = Builder(load_tokenizer(), tmp_path, prose=("linux-doc",), code=())
    train = Builder(load_tokenizer(), tmp_path, prose=("linux-doc",), code=(), split="train")
    for index in range(3):
        a, b = test.item("niah", 1024, index, 3), train.item("niah", 1024, index, 3)
        assert a.answers != b.answers  # another seed: another key and number
        assert {int(k) % 2 for k in re.findall(r"zq(\d+)x", a.context)} == {1}
        assert {int(k) % 2 for k in re.findall(r"zq(\d+)x", b.context)} == {0}
    starts = {train.item("vt", 1024, index, 3).context[:200] for index in range(3)}
    assert len(starts) == 3  # each training item's haystack starts at its own place
    with pytest.raises(EdgememError):
        Builder(load_tokenizer(), tmp_path, split="dev")


def test_names_that_give_the_type_away_are_dropped():
    assert gives_type_away("session", "Session")
    assert gives_type_away("is_valid", "bool")
    assert gives_type_away("name", "str")
    assert not gives_type_away("limit", "int")
    assert not gives_type_away("comments", "bool")


def test_type_normalisation_accepts_equivalent_spellings():
    assert normalize_type("Optional[List[int]]") == normalize_type("list[int] | None")
    assert normalize_type("Union[str, bytes]") == normalize_type("bytes | str")
    assert normalize_type("typing.Dict[str, Any]") == normalize_type("dict[str, Any]")
    assert normalize_type("int") != normalize_type("float")


def test_scoring_on_hand_made_cases():
    assert score("niah", ": 1234567.\nThe special", ["1234567"]).correct
    assert not score("niah", "12345678", ["1234567"]).correct  # a longer number is not the value
    mv = score("niah-mv", "1111111, 2222222 and 3333333", ["1111111", "2222222", "3333333", "4444444"])
    assert not mv.correct and mv.score == 0.75
    assert score("vt", " ABCDE, FGHIJ", ["ABCDE", "FGHIJ"]).correct
    assert score("docqa", ' "Deprecated".', ["deprecated"]).correct
    assert not score("docqa", "removed, not deprecated", ["deprecated"]).correct
    assert score("docqa", "deprecated", ["deprecated"]).em
    assert type_answer("Optional[int]` because") == "Optional[int]"
    assert score("types", "int | None`.", ["Optional[int]"]).correct
    assert not score("types", "str`", ["int"]).correct


def test_a_near_miss_keeps_all_but_two_digits_in_place():
    assert near_miss("The code is 1234599.", "1234567")  # two digits off
    assert not near_miss("1239999", "1234567")  # three off
    assert not near_miss("123456", "1234567")  # a digit short: the rest are out of place
    assert not near_miss("no number", "1234567")
    assert near_miss("12 34 567", "1234567")  # digits are read in order, whatever sits between


def test_types_items_come_from_the_code_corpora_and_the_others_from_prose(builder):
    assert builder.sources("types") == builder.code_sources
    assert all(builder.sources(t) == builder.prose_sources for t in ("niah", "vt", "docqa"))
    assert builder.corpora_id("types") != builder.corpora_id("niah") == builder.corpora_id("vt")
